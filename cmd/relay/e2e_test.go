package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

var build struct {
	once sync.Once
	path string
	err  error
}

// relayBinary builds cmd/relay once per test run.
func relayBinary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "keiro-relay-e2e")
		if err != nil {
			build.err = err
			return
		}
		build.path = filepath.Join(dir, "relay")
		out, err := exec.Command("go", "build", "-o", build.path, ".").CombinedOutput()
		if err != nil {
			build.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}

// process is a running relay binary whose stderr lines are collected.
type process struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	added chan struct{} // signalled on each new line
	done  chan struct{} // closed when the process exited
	err   error
}

func start(t testing.TB, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(relayBinary(t), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	p := &process{cmd: cmd, added: make(chan struct{}, 1), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.added <- struct{}{}:
			default:
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("relay stderr:\n%s", p.output())
		}
	})
	return p
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitLine waits for a stderr line matching re and returns its submatches.
func (p *process) waitLine(t testing.TB, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		for _, l := range p.lines {
			if m := re.FindStringSubmatch(l); m != nil {
				p.mu.Unlock()
				return m
			}
		}
		p.mu.Unlock()
		select {
		case <-p.added:
		case <-p.done:
			t.Fatalf("relay exited (%v) before logging %s", p.err, re)
		case <-deadline.C:
			t.Fatalf("no log line matching %s within %s", re, timeout)
		}
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func regexpMust(s string) *regexp.Regexp { return regexp.MustCompile(s) }

// listening matches the address log line in text (addr=…) and JSON ("addr":"…") format.
var listening = regexp.MustCompile(`http server listening.*addr"?[=:]"?([0-9.]+:[0-9]+)`)

// TestEndToEnd builds the binary, runs it against a fresh schema (migrated by --migrate) and a
// kfake cluster, sees enqueued rows on Kafka, checks the HTTP endpoints, and stops it with
// SIGTERM: exit 0 within --shutdown-timeout.
func TestEndToEnd(t *testing.T) {
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "orders", 3)
	const shutdownTimeout = 5 * time.Second
	dsn, password := withPassword(t, testenv.DatabaseURL())
	p := start(t, []string{
		"KEIRO_RELAY_DATABASE_URL=" + dsn,
		"KEIRO_RELAY_SCHEMA=" + schema,
		"KEIRO_RELAY_BROKERS=" + strings.Join(kc.Seeds, ","),
		"KEIRO_RELAY_HTTP_ADDR=127.0.0.1:0",
		"KEIRO_RELAY_MIGRATE=true",
		"OTEL_SERVICE_NAME=relay-e2e",
	}, "--log-format=json", "--poll-interval=200ms", "--shutdown-timeout="+shutdownTimeout.String())
	addr := p.waitLine(t, listening, 30*time.Second)[1]
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("http addr %q", addr)
	}
	base := "http://" + addr

	if code, body := httpGet(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	code, body := httpGet(t, base+"/readyz")
	if code != 200 || !strings.Contains(body, `"database":"ok"`) || !strings.Contains(body, `"kafka":"ok"`) {
		t.Fatalf("readyz: %d %s", code, body)
	}
	// On loopback the console and the admin API need no token; the relay counts itself.
	if code, body := httpGet(t, base+"/console/"); code != 200 || !strings.Contains(body, "Relays connected") {
		t.Fatalf("console: %d %s", code, body)
	}
	if code, body := httpGet(t, base+"/api/v1/outbox/summary"); code != 200 || !strings.Contains(body, `"relays_connected": 1`) {
		t.Fatalf("outbox summary: %d %s", code, body)
	}

	// Enqueue in a business transaction; the relay publishes.
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := outbox.NewStore(schema)
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	events := make([]envelope.Event, n)
	for i := range events {
		key := fmt.Sprintf("order-%d", i%5)
		events[i] = testEvent(fmt.Sprintf("m-%03d", i), "ordering", "orders", &key)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(ctx, tx, events...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	recs := kc.ConsumeRecords(t, n, 30*time.Second, "orders")
	if len(recs) != n {
		t.Fatalf("consumed %d of %d records", len(recs), n)
	}
	// Per-key order: message ids of one key arrive in enqueue order.
	last := map[string]string{}
	for _, r := range recs {
		ev, err := envelope.Decode(envelope.Record{Key: r.Key, Value: r.Value, Headers: headersOf(r.Headers)})
		if err != nil {
			t.Fatalf("decode record: %v", err)
		}
		k := string(r.Key)
		if ev.MessageID <= last[k] {
			t.Fatalf("key %s: %s after %s", k, ev.MessageID, last[k])
		}
		last[k] = ev.MessageID
	}

	code, body = httpGet(t, base+"/metrics")
	// The batch-size histogram is recorded at claim, before the records were produced, so it is
	// there by now (the published counter is recorded after the mark, which may still be running).
	if code != 200 || !strings.Contains(body, "keiro_outbox_batch_size") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("metrics: %d\n%s", code, body)
	}
	// franz-go's client metrics sit beside keiro's; no series carries the otel_scope_* labels.
	if !strings.Contains(body, "messaging_kafka_connects_count") || !strings.Contains(body, "messaging_client_sent_messages_total") || strings.Contains(body, "otel_scope_") {
		t.Fatalf("metrics: want franz-go client and semantic-convention metrics, no otel_scope_ labels\n%s", body)
	}

	// SIGTERM: exit 0 within the shutdown timeout.
	began := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(shutdownTimeout + 5*time.Second):
		t.Fatalf("relay still running %s after SIGTERM", time.Since(began))
	}
	if p.err != nil {
		t.Fatalf("relay exit: %v", p.err)
	}
	if took := time.Since(began); took > shutdownTimeout {
		t.Fatalf("shutdown took %s, over --shutdown-timeout=%s", took, shutdownTimeout)
	}
	out := p.output()
	if !strings.Contains(out, "relay stopped") || !strings.Contains(out, `"published":50`) {
		t.Fatalf("no orderly stop logged:\n%s", out)
	}
	if strings.Contains(out, password) || !strings.Contains(out, ":******@") {
		t.Fatalf("the database password is printed, or the URL not logged redacted:\n%s", out)
	}
	// Every acknowledged row was marked sent before the process exited.
	r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+schema, "status", "--json")
	var status outboxStatus
	if err := json.Unmarshal([]byte(r.stdout), &status); err != nil || status.Totals["sent"] != n || status.Backlog != 0 {
		t.Fatalf("after shutdown: %+v %v %s", status, err, r.stderr)
	}
}

// withPassword returns dsn with a password (one is added when it has none: the test server
// trusts local connections and ignores it), and that password.
func withPassword(t *testing.T, dsn string) (string, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		t.Fatalf("test database URL %q needs a user", dsn)
	}
	if pw, ok := u.User.Password(); ok {
		return dsn, pw
	}
	const pw = "e2e-hunter2-secret"
	u.User = url.UserPassword(u.User.Username(), pw)
	return u.String(), pw
}

func headersOf(hs []kgo.RecordHeader) []envelope.Header {
	out := make([]envelope.Header, len(hs))
	for i, h := range hs {
		out[i] = envelope.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

// The relay refuses to start on an unmigrated schema without --migrate, and says what to do.
func TestRunRefusesUnmigratedSchema(t *testing.T) {
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	kc := testenv.NewKafka(t)
	p := start(t, nil, "--database-url="+testenv.DatabaseURL(), "--schema="+schema, "--brokers="+kc.Seeds[0], "--http-addr=")
	<-p.done
	if ee := (*exec.ExitError)(nil); !errors.As(p.err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("want exit 1, got %v", p.err)
	}
	if !strings.Contains(p.output(), "run `relay migrate` or start with --migrate") {
		t.Fatalf("stderr:\n%s", p.output())
	}
}

// A configuration error exits 2 and reports every problem, from the real binary.
func TestBinaryConfigErrors(t *testing.T) {
	p := start(t, []string{"KEIRO_RELAY_BATCH_SIZE=0"}, "--policy=nope")
	<-p.done
	if ee := (*exec.ExitError)(nil); !errors.As(p.err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("want exit 2, got %v", p.err)
	}
	for _, want := range []string{"--database-url: is required", "--brokers: is required", "--batch-size: must be at least 1", `--policy: unknown policy "nope"`} {
		if !strings.Contains(p.output(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, p.output())
		}
	}
}

// /readyz names the dependency that is down: here Kafka (nothing listens at the broker address),
// while PostgreSQL is fine; /healthz stays 200.
func TestReadyzNamesFailingKafka(t *testing.T) {
	db := testenv.NewDB(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadBroker := ln.Addr().String()
	ln.Close()
	p := start(t, nil, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "--brokers="+deadBroker,
		"--http-addr=127.0.0.1:0", "--shutdown-timeout=3s")
	base := "http://" + p.waitLine(t, listening, 30*time.Second)[1]
	code, body := httpGet(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"failing":["kafka"]`) || !strings.Contains(body, `"database":"ok"`) {
		t.Fatalf("readyz with Kafka down: %d %s", code, body)
	}
	if code, _ := httpGet(t, base+"/healthz"); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if p.err != nil {
		t.Fatalf("exit with Kafka down: %v", p.err)
	}
}

// TestAdminNeedsATokenOffLoopback: bound to every interface, the admin API and console refuse
// every request until a token is set, then require it; /metrics and /healthz stay open and
// the token is never printed.
func TestAdminNeedsATokenOffLoopback(t *testing.T) {
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	get := func(url, bearer string) int {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	args := []string{"--database-url=" + testenv.DatabaseURL(), "--schema=" + db.Schema, "--brokers=" + kc.Seeds[0],
		"--http-addr=0.0.0.0:0", "--shutdown-timeout=3s"}
	local := func(p *process) string {
		addr := p.waitLine(t, regexp.MustCompile(`http server listening.*addr=(\S+)`), 30*time.Second)[1]
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		return "http://127.0.0.1:" + port
	}
	stop := func(p *process) {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		<-p.done
	}

	open := start(t, nil, args...)
	base := local(open)
	if code := get(base+"/api/v1/outbox/summary", ""); code != http.StatusForbidden {
		t.Fatalf("admin API off loopback without a token: %d", code)
	}
	if code := get(base+"/healthz", ""); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	stop(open)

	const token = "e2e-admin-token-7f3a"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	guarded := start(t, []string{"KEIRO_RELAY_ADMIN_TOKEN_FILE=" + file}, args...)
	base = local(guarded)
	if code := get(base+"/console/", ""); code != http.StatusUnauthorized {
		t.Fatalf("console without the token: %d", code)
	}
	if code := get(base+"/console/", token); code != 200 {
		t.Fatalf("console with the token: %d", code)
	}
	if code := get(base+"/api/v1/outbox/rows", "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("admin API with a wrong token: %d", code)
	}
	stop(guarded)
	if strings.Contains(guarded.output(), token) {
		t.Fatalf("the admin token was printed:\n%s", guarded.output())
	}
}

// A bad OTEL_* variable is a configuration error (exit 2) naming the variable.
func TestBadOTelEnvIsAUsageError(t *testing.T) {
	db := testenv.NewDB(t)
	p := start(t, []string{"OTEL_TRACES_SAMPLER=sometimes"}, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema,
		"--brokers=127.0.0.1:1", "--http-addr=")
	<-p.done
	if ee := (*exec.ExitError)(nil); !errors.As(p.err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("want exit 2, got %v\n%s", p.err, p.output())
	}
	if !strings.Contains(p.output(), "OTEL_TRACES_SAMPLER") {
		t.Fatalf("the variable is not named:\n%s", p.output())
	}
}

// relay run --mode=log (KEIRO_RELAY_MODE=log) switches the schema, publishes the rows pending
// in keiro_outbox first, then those written in log mode from the slot, each key in order.
func TestEndToEndLogMode(t *testing.T) {
	db := testenv.NewDB(t)
	slot := db.Schema + "_keiro_log"
	t.Cleanup(func() { // after the relay's process has stopped (cleanups run last in, first out)
		ctx := context.Background()
		for range 100 {
			_, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
			if err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond) // the stopped relay's walsender releases the slot shortly after
		}
		_, _ = db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+slot)
	})
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "orders", 3)
	ctx := context.Background()
	st, err := outbox.NewStore(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := outbox.NewAdmin(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(from, to int) {
		evs := make([]envelope.Event, 0, to-from)
		for i := from; i < to; i++ {
			key := fmt.Sprintf("order-%d", i%5)
			evs = append(evs, testEvent(fmt.Sprintf("m-%03d", i), "ordering", "orders", &key))
		}
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := st.EnqueueTx(ctx, tx, evs...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(0, 20) // claim mode: pending in keiro_outbox when the relay starts
	start(t, []string{
		"KEIRO_RELAY_DATABASE_URL=" + testenv.DatabaseURL(),
		"KEIRO_RELAY_SCHEMA=" + db.Schema,
		"KEIRO_RELAY_BROKERS=" + strings.Join(kc.Seeds, ","),
		"KEIRO_RELAY_HTTP_ADDR=127.0.0.1:0",
		"KEIRO_RELAY_MODE=log",
	}, "--log-format=json", "--poll-interval=100ms")
	testenv.WaitFor(t, 30*time.Second, "the relay switched the schema to log mode", func() bool {
		m, err := admin.Mode(ctx, db.Pool)
		return err == nil && m == outbox.ModeLog
	})
	enqueue(20, 50)
	recs := kc.ConsumeRecords(t, 50, 30*time.Second, "orders")
	if len(recs) != 50 {
		t.Fatalf("consumed %d of 50 records", len(recs))
	}
	last := map[string]string{}
	for _, r := range recs {
		ev, err := envelope.Decode(envelope.Record{Key: r.Key, Value: r.Value, Headers: headersOf(r.Headers)})
		if err != nil {
			t.Fatalf("decode record: %v", err)
		}
		if k := string(r.Key); ev.MessageID <= last[k] {
			t.Fatalf("key %s: %s after %s", k, ev.MessageID, last[k])
		} else {
			last[k] = ev.MessageID
		}
	}
	var inLog int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox_log").Scan(&inLog); err != nil || inLog != 30 {
		t.Fatalf("keiro_outbox_log holds %d rows (%v), want 30", inLog, err)
	}
}
