package httpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of [Config].
const (
	// DefaultAddr is loopback on the OpenTelemetry Prometheus exporter's conventional port.
	DefaultAddr            = "127.0.0.1:9464"
	DefaultCheckTimeout    = 2 * time.Second
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultReadHeaderTimeout bounds reading a request's headers.
	DefaultReadHeaderTimeout = 5 * time.Second
	// DefaultReadTimeout bounds reading a whole request, its body included: a client that
	// sends its headers and stalls the body is disconnected.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds a response, from the end of the request's headers: a page,
	// /metrics or /readyz.
	DefaultWriteTimeout = time.Minute
	// DefaultActionWriteTimeout is the write deadline of the admin API's and the console's
	// actions (POST), which may requeue, retry or archive a whole group.
	DefaultActionWriteTimeout = 5 * time.Minute
	// DefaultIdleTimeout closes a keep-alive connection that has sent no request for so long.
	DefaultIdleTimeout = time.Minute
	// DefaultMaxHeaderBytes bounds a request's headers (431 beyond).
	DefaultMaxHeaderBytes = 64 << 10
	// DefaultMaxBodyBytes bounds a request's body (413 beyond), as the console bounds a POST.
	DefaultMaxBodyBytes = 1 << 20
)

// Check is one readiness check: Run returns nil when the dependency is usable.
type Check struct {
	// Name identifies the check in /readyz answers ("database", "kafka").
	Name string
	// Run performs the check; ctx carries Config.CheckTimeout.
	Run func(ctx context.Context) error
}

// Config configures the server.
type Config struct {
	// Addr is the host:port to listen on. Defaults to [DefaultAddr]; use Listen only when the
	// binary's flag is not empty (empty means disabled).
	Addr string
	// Metrics serves /metrics. Defaults to nil: /metrics answers 404.
	Metrics http.Handler
	// Admin serves the admin API (/api/) and the operator console (/console/), and / redirects
	// to the console. Defaults to nil: those paths answer 404.
	Admin http.Handler
	// Checks are the readiness checks of /readyz. Defaults to none: ready while not draining.
	Checks []Check
	// CheckTimeout bounds each readiness check. Defaults to [DefaultCheckTimeout].
	CheckTimeout time.Duration
	// ShutdownTimeout bounds the graceful shutdown when Serve's context ends. Defaults to
	// [DefaultShutdownTimeout].
	ShutdownTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers. Defaults to
	// [DefaultReadHeaderTimeout].
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included. Defaults to
	// [DefaultReadTimeout].
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response, from the end of the request's headers. Defaults
	// to [DefaultWriteTimeout].
	WriteTimeout time.Duration
	// ActionWriteTimeout replaces WriteTimeout for Admin's POST requests (actions on whole
	// groups of rows). Defaults to [DefaultActionWriteTimeout].
	ActionWriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle for so long. Defaults to
	// [DefaultIdleTimeout].
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers; larger ones are answered 431. Defaults to
	// [DefaultMaxHeaderBytes].
	MaxHeaderBytes int
	// MaxBodyBytes bounds a request's body: a Content-Length above it is answered 413 before
	// any handler runs, and a longer body without one fails the handler's read with
	// *http.MaxBytesError. Defaults to [DefaultMaxBodyBytes].
	MaxBodyBytes int64
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.CheckTimeout == 0 {
		c.CheckTimeout = DefaultCheckTimeout
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.ActionWriteTimeout == 0 {
		c.ActionWriteTimeout = DefaultActionWriteTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("Addr %q is not host:port: %w", c.Addr, err))
	}
	if c.CheckTimeout < 0 {
		errs = append(errs, fmt.Errorf("CheckTimeout must not be negative, got %s", c.CheckTimeout))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ShutdownTimeout", c.ShutdownTimeout}, {"ReadHeaderTimeout", c.ReadHeaderTimeout}, {"ReadTimeout", c.ReadTimeout},
		{"WriteTimeout", c.WriteTimeout}, {"ActionWriteTimeout", c.ActionWriteTimeout}, {"IdleTimeout", c.IdleTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", d.name, d.v))
		}
	}
	if c.MaxHeaderBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxHeaderBytes must not be negative, got %d", c.MaxHeaderBytes))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBodyBytes must not be negative, got %d", c.MaxBodyBytes))
	}
	seen := map[string]bool{}
	for i, ch := range c.Checks {
		switch {
		case ch.Name == "":
			errs = append(errs, fmt.Errorf("Checks[%d] has no Name", i))
		case seen[ch.Name]:
			errs = append(errs, fmt.Errorf("Checks[%d]: duplicate name %q", i, ch.Name))
		}
		seen[ch.Name] = true
		if ch.Run == nil {
			errs = append(errs, fmt.Errorf("Checks[%d] (%s) has no Run", i, ch.Name))
		}
	}
	return errors.Join(errs...)
}

// Server serves the operational endpoints.
type Server struct {
	cfg      Config
	ln       net.Listener
	srv      *http.Server
	draining atomic.Bool
}

// Listen validates cfg and binds its address. Call Serve to answer requests.
func Listen(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("configure http server: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen for http on %s: %w", cfg.Addr, err)
	}
	s := &Server{cfg: cfg, ln: ln}
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
	}
	return s, nil
}

// NewHandler returns the endpoints' handler without a listener, for embedding in another mux
// or for tests.
func NewHandler(cfg Config) (http.Handler, *Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, nil, fmt.Errorf("configure http server: %w", err)
	}
	s := &Server{cfg: cfg}
	return s.Handler(), s, nil
}

// Addr returns the bound address (with the real port when Config.Addr used port 0).
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// SetDraining makes /readyz answer 503 from now on; call it when shutdown starts.
func (s *Server) SetDraining() { s.draining.Store(true) }

// Serve answers requests until ctx ends, then shuts down gracefully within
// Config.ShutdownTimeout, and returns nil, or the error that stopped serving.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http on %s: %w", s.Addr(), err)
	case <-ctx.Done():
	}
	s.SetDraining()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		_ = s.srv.Close()
		return fmt.Errorf("shut down http server on %s: %w", s.Addr(), err)
	}
	return nil
}

// Handler returns the mux of /healthz, /readyz, /metrics and, when set, Config.Admin, with
// request bodies bounded by Config.MaxBodyBytes.
func (s *Server) Handler() http.Handler {
	return s.boundBody(s.mux())
}

// boundBody answers 413 to a request whose Content-Length exceeds Config.MaxBodyBytes and
// bounds the body of the others.
func (s *Server) boundBody(h http.Handler) http.Handler {
	limit := s.cfg.MaxBodyBytes
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			w.Header().Set("Connection", "close")
			http.Error(w, fmt.Sprintf("request body of %d bytes is over the limit of %d", r.ContentLength, limit),
				http.StatusRequestEntityTooLarge)
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = http.MaxBytesReader(w, r.Body, limit)
		}
		h.ServeHTTP(w, r)
	})
}

// action gives Admin's POST requests Config.ActionWriteTimeout to answer instead of
// Config.WriteTimeout.
func (s *Server) action(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			// Not supported by a ResponseWriter without a connection (NewHandler in a test).
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.ActionWriteTimeout))
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Server) mux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	if s.cfg.Metrics != nil {
		mux.Handle("GET /metrics", s.cfg.Metrics)
	}
	if s.cfg.Admin != nil {
		admin := s.action(s.cfg.Admin)
		mux.Handle("/api/", admin)
		mux.Handle("/console/", admin)
		mux.Handle("/console", admin)
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/console/", http.StatusFound)
		})
	}
	return mux
}

// Readiness is the JSON body of /readyz.
type Readiness struct {
	// Status is "ok", "unavailable" (a check failed) or "draining" (shutting down).
	Status string `json:"status"`
	// Checks maps each check's name to "ok" or its error.
	Checks map[string]string `json:"checks,omitempty"`
	// Failing lists the names of the failing checks, sorted.
	Failing []string `json:"failing,omitempty"`
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	body := s.Ready(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if body.Status != "ok" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}

// Ready runs every check concurrently and reports the outcome /readyz serves.
func (s *Server) Ready(ctx context.Context) Readiness {
	if s.draining.Load() {
		return Readiness{Status: "draining"}
	}
	res := Readiness{Status: "ok", Checks: make(map[string]string, len(s.cfg.Checks))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ch := range s.cfg.Checks {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.CheckTimeout)
			defer cancel()
			err := ch.Run(cctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Checks[ch.Name] = "error: " + err.Error()
				res.Failing = append(res.Failing, ch.Name)
				return
			}
			res.Checks[ch.Name] = "ok"
		})
	}
	wg.Wait()
	if len(res.Failing) > 0 {
		res.Status = "unavailable"
		sort.Strings(res.Failing)
	}
	return res
}
