package httpserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"

	"github.com/keiro-go/keiro/internal/httpserver"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestEndpoints(t *testing.T) {
	dbUp := true
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "keiro_outbox_backlog 3\n")
	})
	h, srv, err := httpserver.NewHandler(httpserver.Config{
		Metrics: metrics,
		Checks: []httpserver.Check{
			{Name: "database", Run: func(context.Context) error {
				if !dbUp {
					return errors.New("connection refused")
				}
				return nil
			}},
			{Name: "kafka", Run: func(context.Context) error { return nil }},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, h, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	if code, body := get(t, h, "/metrics"); code != 200 || !strings.Contains(body, "keiro_outbox_backlog") {
		t.Fatalf("metrics: %d %q", code, body)
	}
	code, body := get(t, h, "/readyz")
	var r httpserver.Readiness
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if code != 200 || r.Status != "ok" || r.Checks["database"] != "ok" || r.Checks["kafka"] != "ok" {
		t.Fatalf("readyz: %d %s", code, body)
	}

	dbUp = false
	code, body = get(t, h, "/readyz")
	r = httpserver.Readiness{}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if code != http.StatusServiceUnavailable || r.Status != "unavailable" || len(r.Failing) != 1 || r.Failing[0] != "database" ||
		!strings.Contains(r.Checks["database"], "connection refused") || r.Checks["kafka"] != "ok" {
		t.Fatalf("readyz with database down: %d %s", code, body)
	}

	dbUp = true
	srv.SetDraining()
	if code, body := get(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
		t.Fatalf("readyz while draining: %d %s", code, body)
	}
	if code, _ := get(t, h, "/healthz"); code != 200 {
		t.Fatal("healthz must stay up while draining")
	}
}

func TestCheckTimeoutNamesTheCheck(t *testing.T) {
	h, _, err := httpserver.NewHandler(httpserver.Config{
		CheckTimeout: 50 * time.Millisecond,
		Checks: []httpserver.Check{{Name: "kafka", Run: func(ctx context.Context) error {
			<-ctx.Done() // a broker that never answers
			return ctx.Err()
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	code, body := get(t, h, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"kafka"`) || !strings.Contains(body, "deadline exceeded") {
		t.Fatalf("%d %s", code, body)
	}
}

func TestNoMetricsHandler(t *testing.T) {
	h, _, err := httpserver.NewHandler(httpserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, h, "/metrics"); code != http.StatusNotFound {
		t.Fatalf("metrics without handler: %d", code)
	}
}

func TestInvalidConfigReportsAll(t *testing.T) {
	_, err := httpserver.Listen(httpserver.Config{
		Addr:         "no-port",
		CheckTimeout: -1,
		Checks:       []httpserver.Check{{Name: ""}, {Name: "a", Run: func(context.Context) error { return nil }}, {Name: "a"}},
	})
	if err == nil {
		t.Fatal("expected error")
	}
	for _, want := range []string{"Addr", "CheckTimeout", "Checks[0] has no Name", `duplicate name "a"`, "Checks[2] (a) has no Run"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}

func TestListenPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := httpserver.Listen(httpserver.Config{Addr: ln.Addr().String()}); err == nil || !strings.Contains(err.Error(), "listen for http") {
		t.Fatalf("want listen error, got %v", err)
	}
}

// Serve answers on the bound port and, when its context ends, lets an in-flight request finish
// before returning nil.
func TestServeGracefulShutdown(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	srv, err := httpserver.Listen(httpserver.Config{
		Addr:         "127.0.0.1:0",
		CheckTimeout: 10 * time.Second,
		Checks: []httpserver.Check{{Name: "slow", Run: func(ctx context.Context) error {
			close(entered)
			<-release
			return nil
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(srv.Addr(), "127.0.0.1:") || strings.HasSuffix(srv.Addr(), ":0") {
		t.Fatalf("addr %q", srv.Addr())
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()

	resp, err := http.Get("http://" + srv.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz %d", resp.StatusCode)
	}

	type result struct {
		code int
		err  error
	}
	inflight := make(chan result, 1)
	go func() {
		resp, err := http.Get("http://" + srv.Addr() + "/readyz")
		if err != nil {
			inflight <- result{err: err}
			return
		}
		resp.Body.Close()
		inflight <- result{code: resp.StatusCode}
	}()
	<-entered
	cancel()
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v while a request was in flight", err)
	default:
	}
	close(release)
	if r := <-inflight; r.err != nil || r.code != 200 {
		t.Fatalf("in-flight request: %+v", r)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := http.Get("http://" + srv.Addr() + "/healthz"); err == nil {
		t.Fatal("server still answers after shutdown")
	}
	http.DefaultClient.CloseIdleConnections()
}

// TestAdminMounted serves Config.Admin for /api/ and /console/, redirects / to the console,
// and keeps the operational endpoints out of its reach.
func TestAdminMounted(t *testing.T) {
	admin := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "admin "+r.URL.Path)
	})
	h, _, err := httpserver.NewHandler(httpserver.Config{Admin: admin})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/api/v1/outbox/summary", "/console/", "/console/outbox"} {
		if code, body := get(t, h, p); code != 200 || body != "admin "+p {
			t.Fatalf("%s: %d %q", p, code, body)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusFound || rec.Header().Get("Location") != "/console/" {
		t.Fatalf("/: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	if code, body := get(t, h, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	// Without Admin the paths are not served.
	plain, _, err := httpserver.NewHandler(httpserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, plain, "/console/"); code != http.StatusNotFound {
		t.Fatalf("console without Admin: %d", code)
	}
}

// serve starts a server with cfg on a loopback port and returns its address.
func serve(t *testing.T, cfg httpserver.Config) string {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	srv, err := httpserver.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv.Addr()
}

// closedByServer reads conn until the server closes it and returns what it read; it fails
// the test if the connection is still open after a guard far above the server's timeouts.
func closedByServer(t *testing.T, conn net.Conn) string {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open (read so far: %q)", b)
	}
	return string(b)
}

// A client that sends a request's headers and then stalls its body is disconnected after
// ReadTimeout; the handler's read of the body fails.
func TestStalledBodyIsDisconnected(t *testing.T) {
	readErr := make(chan error, 1)
	addr := serve(t, httpserver.Config{ReadTimeout: 200 * time.Millisecond, Admin: http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			_, err := io.ReadAll(r.Body)
			readErr <- err
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
			}
		})})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /api/v1/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{\"partial\":")
	if err != nil {
		t.Fatal(err)
	}
	closedByServer(t, conn)
	if err := <-readErr; err == nil {
		t.Fatal("the handler read a body the client never finished")
	}
}

// A keep-alive connection that sends no further request is closed after IdleTimeout.
func TestIdleKeepAliveConnectionIsClosed(t *testing.T) {
	addr := serve(t, httpserver.Config{IdleTimeout: 200 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close || string(body) != "ok\n" {
		t.Fatalf("healthz: %d close=%v %q", resp.StatusCode, resp.Close, body)
	}
	if rest := closedByServer(t, conn); rest != "" || br.Buffered() != 0 {
		t.Fatalf("unexpected bytes after the response: %q", rest)
	}
}

// A body over MaxBodyBytes is refused with 413: by its Content-Length before the handler runs,
// or, sent chunked, by the handler's read failing with *http.MaxBytesError.
func TestOversizedBodyIsRefused(t *testing.T) {
	handled := make(chan error, 1)
	addr := serve(t, httpserver.Config{MaxBodyBytes: 1024, Admin: http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			_, err := io.ReadAll(r.Body)
			handled <- err
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			}
		})})
	big := strings.Repeat("x", 4096)
	resp, err := http.Post("http://"+addr+"/api/v1/x", "application/json", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("Content-Length over the limit: %d", resp.StatusCode)
	}
	select {
	case err := <-handled:
		t.Fatalf("the handler ran (read: %v)", err)
	default:
	}
	// Without a Content-Length (chunked): the handler's read stops at the limit.
	resp, err = http.Post("http://"+addr+"/api/v1/x", "application/json", io.MultiReader(strings.NewReader(big)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var mbe *http.MaxBytesError
	if err := <-handled; !errors.As(err, &mbe) || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked body over the limit: read %v, status %d", err, resp.StatusCode)
	}
	// Within the limit: served.
	resp, err = http.Post("http://"+addr+"/api/v1/x", "application/json", strings.NewReader(big[:1024]))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := <-handled; err != nil || resp.StatusCode != 200 {
		t.Fatalf("body at the limit: read %v, status %d", err, resp.StatusCode)
	}
}

// Headers over MaxHeaderBytes are answered 431.
func TestOversizedHeadersAreRefused(t *testing.T) {
	addr := serve(t, httpserver.Config{MaxHeaderBytes: 1024})
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Big", strings.Repeat("x", 8<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// A response that takes longer than WriteTimeout is cut (the client sees the connection
// closed), except an Admin action's (POST), which has ActionWriteTimeout.
func TestWriteTimeoutAndActions(t *testing.T) {
	const wt = 100 * time.Millisecond
	addr := serve(t, httpserver.Config{WriteTimeout: wt, ActionWriteTimeout: time.Minute, Admin: http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			// Past the write deadline WriteTimeout sets when the request was read.
			<-time.After(3 * wt)
			_, _ = io.WriteString(w, "done")
		})})
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := client.Get("http://" + addr + "/console/slow"); err == nil {
		resp.Body.Close()
		t.Fatalf("a page past WriteTimeout was answered: %d", resp.StatusCode)
	}
	resp, err := client.Post("http://"+addr+"/console/slow", "application/x-www-form-urlencoded", strings.NewReader("a=b"))
	if err != nil {
		t.Fatalf("an action within ActionWriteTimeout failed: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "done" {
		t.Fatalf("action: %d %q", resp.StatusCode, body)
	}
}
