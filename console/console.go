package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Console serves the admin API under /api/v1/ and the web console under /console/.
type Console struct {
	cfg   Config
	guard *guard
	mux   *http.ServeMux
	pages map[string]*template.Template
	log   *slog.Logger

	outbox *outbox.Admin
	inbox  *inbox.Admin
	events *events.Store

	// apiPatterns are the /api/v1 routes registered, as given to the mux.
	apiPatterns []string
	// openapi is the API's OpenAPI document (GET /api/v1/openapi.json).
	openapi map[string]any
	// fetched, when set (by tests), is told the bytes of each Fetch answer read from a
	// dead-letter topic.
	fetched func(bytes int)
}

// New validates cfg and returns the console's handler. Mount it for the paths /api/v1/ and
// /console/ (a mux entry for each prefix, or as the whole handler of a server).
func New(cfg Config) (*Console, error) {
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("configure console: %w", err)
	}
	c := &Console{cfg: cfg, guard: newGuard(cfg.Auth), mux: http.NewServeMux(), log: cfg.Logger}
	var err error
	if cfg.Outbox != nil {
		if c.outbox, err = outbox.NewAdmin(cfg.Outbox.Schema); err != nil {
			return nil, fmt.Errorf("configure console: %w", err)
		}
	}
	if cfg.Inbox != nil {
		st, err := inbox.NewStore(inbox.StoreConfig{Schema: cfg.Inbox.Schema, Consumer: cfg.Inbox.Consumer, MaxAttempts: cfg.Inbox.MaxAttempts})
		if err != nil {
			return nil, fmt.Errorf("configure console: %w", err)
		}
		c.inbox = inbox.NewAdmin(st)
	}
	if cfg.Events != nil {
		if c.events, err = events.NewStore(events.StoreConfig{Schema: cfg.Events.Schema}); err != nil {
			return nil, fmt.Errorf("configure console: %w", err)
		}
	}
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	c.openapi = openAPIDocument()
	c.routes()
	return c, nil
}

func (c *Console) routes() {
	m := c.mux
	// JSON API: every route is described in apiOperations (openapi.go).
	api := func(pattern string, h http.HandlerFunc) {
		c.apiPatterns = append(c.apiPatterns, pattern)
		m.HandleFunc(pattern, h)
	}
	api("GET /api/v1/openapi.json", c.apiOpenAPI)
	api("GET /api/v1/outbox/summary", c.needOutbox(apiRead(c, c.readOutboxSummary)))
	api("GET /api/v1/outbox/rows", c.needOutbox(apiQuery(c, parseOutboxFilter, c.listOutboxRows)))
	api("GET /api/v1/outbox/rows/{id}", c.needOutbox(c.apiOutboxRow))
	api("POST /api/v1/outbox/requeue", c.needOutbox(apiAction(c, "requeue", func(q RequeueRequest) error { _, err := q.filter(); return err }, c.requeue)))
	api("GET /api/v1/outbox/groups", c.needOutbox(apiRead(c, c.readOutboxGroups)))
	api("POST /api/v1/outbox/groups/requeue", c.needOutbox(c.apiOutboxGroupRequeue))
	api("POST /api/v1/outbox/archive", c.needOutbox(c.apiOutboxArchive))
	api("POST /api/v1/inbox/archive", c.needInbox(c.apiInboxArchive))
	api("GET /api/v1/inbox/groups", c.needInbox(apiRead(c, c.readInboxGroups)))
	api("POST /api/v1/inbox/groups/retry", c.needInbox(c.apiInboxGroupRetry))
	api("GET /api/v1/inbox/summary", c.needInbox(apiRead(c, c.readInboxSummary)))
	api("GET /api/v1/inbox/failed", c.needInbox(c.apiInboxFailed))
	api("GET /api/v1/inbox/failed/{source}/{key...}", c.needInbox(c.apiInboxEntry))
	api("POST /api/v1/inbox/retry", c.needInbox(c.apiInboxRetry))
	api("GET /api/v1/consumer/lag", c.needInbox(c.apiLag))
	api("GET /api/v1/search", c.needRows(c.apiSearch))
	api("GET /api/v1/inbox/dead-letters", c.needDeadLetters(c.apiDeadLetters))
	api("GET /api/v1/inbox/dead-letters/{topic}/{partition}/{offset}", c.needDeadLetters(c.apiDeadLetter))
	api("POST /api/v1/inbox/dead-letters/replay", c.needDeadLetters(apiAction(c, "replay", ReplayRequest.validate, c.replayDeadLetters)))
	api("GET /api/v1/subscriptions", c.needEvents(apiRead(c, c.readSubscriptions)))
	api("GET /api/v1/subscriptions/dead-letters", c.needEvents(apiQuery(c, parseSubDeadLetterFilter, c.listSubDeadLetters)))
	api("POST /api/v1/subscriptions/dead-letters/replay", c.needEvents(apiAction(c, "replay", SubscriptionReplayRequest.validate, c.replaySubDeadLetters)))
	api("GET /api/v1/sagas", c.needEvents(apiQuery(c, parseSagasFilter, c.readSagas)))
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no API endpoint %s %s (see docs/console.md for the list)", r.Method, r.URL.Path))
	})
	// Web console.
	m.HandleFunc("GET /console/{$}", c.pageOverview)
	m.HandleFunc("GET /console/outbox", c.needOutbox(c.pageOutboxRows))
	m.HandleFunc("GET /console/outbox/groups", c.needOutbox(c.pageOutboxGroups))
	m.HandleFunc("POST /console/outbox/groups/requeue", c.needOutbox(c.pageOutboxGroupRequeue))
	m.HandleFunc("POST /console/outbox/archive", c.needOutbox(c.pageOutboxArchive))
	m.HandleFunc("POST /console/inbox/archive", c.needInbox(c.pageInboxArchive))
	m.HandleFunc("GET /console/archived", c.pageArchived)
	m.HandleFunc("GET /console/inbox/groups", c.needInbox(c.pageInboxGroups))
	m.HandleFunc("POST /console/inbox/groups/retry", c.needInbox(c.pageInboxGroupRetry))
	m.HandleFunc("GET /console/outbox/{id}", c.needOutbox(c.pageOutboxRow))
	m.HandleFunc("POST /console/outbox/requeue", c.needOutbox(c.pageOutboxRequeue))
	m.HandleFunc("GET /console/outbox/requeued", c.needOutbox(c.pageOutboxRequeued))
	m.HandleFunc("GET /console/inbox", c.needInbox(c.pageInboxFailed))
	m.HandleFunc("GET /console/inbox/{source}/{key...}", c.needInbox(c.pageInboxEntry))
	m.HandleFunc("POST /console/inbox/retry", c.needInbox(c.pageInboxRetry))
	m.HandleFunc("GET /console/inbox/retried", c.needInbox(c.pageInboxRetried))
	m.HandleFunc("GET /console/search", c.needRows(c.pageSearch))
	m.HandleFunc("GET /console/dead-letters", c.needDeadLetters(c.pageDeadLetters))
	m.HandleFunc("GET /console/dead-letters/{topic}/{partition}/{offset}", c.needDeadLetters(c.pageDeadLetter))
	m.HandleFunc("POST /console/dead-letters/replay", c.needDeadLetters(c.pageDeadLetterReplay))
	m.HandleFunc("GET /console/dead-letters/replayed", c.needDeadLetters(c.pageDeadLetterReplayed))
	m.HandleFunc("GET /console/subscriptions", c.needEvents(c.pageSubscriptions))
	m.HandleFunc("GET /console/subscriptions/dead-letters", c.needEvents(c.pageSubDeadLetters))
	m.HandleFunc("POST /console/subscriptions/dead-letters/replay", c.needEvents(c.pageSubDeadLetterReplay))
	m.HandleFunc("GET /console/subscriptions/dead-letters/replayed", c.needEvents(c.pageSubDeadLetterReplayed))
	m.HandleFunc("GET /console/sagas", c.needEvents(c.pageSagas))
	static, _ := fs.Sub(assetFS, "assets")
	m.Handle("GET /console/assets/", http.StripPrefix("/console/assets/", assetHandler(http.FileServerFS(static))))
	m.HandleFunc("GET /console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
	})
	m.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		c.pageError(w, r, http.StatusNotFound, "There is no page at "+r.URL.Path+".")
	})
}

// apiRead serves what read returns as JSON (200), or a server error: the read-only endpoints that
// take no parameters (the summaries, the subscriptions).
func apiRead[T any](c *Console, read func(context.Context) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := read(r.Context())
		if err != nil {
			c.serverError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// apiQuery is a GET handler of the admin API: parse the request's query into F (400 with
// its error when it is bad), read and answer the result as JSON.
func apiQuery[F, T any](c *Console, parse func(*http.Request) (F, error), read func(context.Context, F) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f, err := parse(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		v, err := read(r.Context(), f)
		if err != nil {
			c.serverError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// apiAction is a POST handler of the admin API: decode the JSON body into Q, refuse it with
// 400 "verb: …" when check fails, run act and answer its result as JSON.
func apiAction[Q, A any](c *Console, verb string, check func(Q) error, act func(*http.Request, Q) (A, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var q Q
		if status, msg := decodeBody(r, &q); status != 0 {
			writeError(w, status, msg)
			return
		}
		if err := check(q); err != nil {
			writeError(w, http.StatusBadRequest, verb+": "+err.Error())
			return
		}
		ans, err := act(r, q)
		if err != nil {
			c.serverError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, ans)
	}
}

func assetHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		h.ServeHTTP(w, r)
	})
}

// ServeHTTP authenticates the request, applies the read-only and CSRF rules to POSTs, and
// serves it.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	api := strings.HasPrefix(r.URL.Path, "/api/")
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	if msg := c.guard.checkHost(r); msg != "" {
		c.log.Warn("console: request refused", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "host", cleanHost(r.Host),
			"status", http.StatusMisdirectedRequest, "reason", "Host is not loopback")
		c.fail(w, r, api, http.StatusMisdirectedRequest, msg)
		return
	}
	p, status, msg := c.guard.authenticate(r)
	if status != 0 {
		c.log.Warn("console: request refused", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "status", status, "reason", msg)
		if status == http.StatusUnauthorized {
			h.Set("WWW-Authenticate", `Basic realm="keiro console", charset="UTF-8"`)
		}
		c.fail(w, r, api, status, msg)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		h.Set(csrfHeader, c.guard.csrfToken(p))
	case http.MethodPost:
		r.Body = http.MaxBytesReader(w, r.Body, MaxRequestBytes)
		if c.cfg.ReadOnly {
			c.refusePost(w, r, api, p, http.StatusForbidden, "the console is read-only (--admin-read-only): no action is allowed")
			return
		}
		var reason string
		if api {
			reason = c.guard.checkAPI(r, p)
		} else {
			if err := r.ParseForm(); err != nil {
				c.refusePost(w, r, api, p, formStatus(err), "read the form: "+err.Error())
				return
			}
			reason = c.guard.checkForm(r, p)
		}
		if reason != "" {
			c.refusePost(w, r, api, p, http.StatusForbidden, reason)
			return
		}
	}
	if msg := badText(r); msg != "" {
		c.fail(w, r, api, http.StatusBadRequest, msg)
		return
	}
	c.mux.ServeHTTP(w, r)
}

func formStatus(err error) int {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

func (c *Console) refusePost(w http.ResponseWriter, r *http.Request, api bool, p principal, status int, msg string) {
	c.log.Warn("console: action refused", "who", p.name, "remote", r.RemoteAddr, "path", r.URL.Path, "status", status, "reason", msg)
	c.fail(w, r, api, status, msg)
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, api bool, status int, msg string) {
	if api {
		writeError(w, status, msg)
		return
	}
	c.pageError(w, r, status, msg)
}

// needOutbox answers 404 when the outbox is not configured.
func (c *Console) needOutbox(h http.HandlerFunc) http.HandlerFunc {
	return c.need(c.cfg.Outbox != nil, "the outbox", h)
}

func (c *Console) needInbox(h http.HandlerFunc) http.HandlerFunc {
	return c.need(c.cfg.Inbox != nil, "the inbox", h)
}

func (c *Console) needEvents(h http.HandlerFunc) http.HandlerFunc {
	return c.need(c.cfg.Events != nil, "the event store", h)
}

func (c *Console) need(on bool, what string, h http.HandlerFunc) http.HandlerFunc {
	if on {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		msg := what + " is not configured on this server (the relay serves the outbox, the consumer the inbox)"
		c.fail(w, r, strings.HasPrefix(r.URL.Path, "/api/"), http.StatusNotFound, msg)
	}
}

// apiError is the body of every API error.
type apiError struct {
	// Error says what went wrong and what to do.
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Error: msg})
}

// serverError logs err and answers 500 (API) or the error page.
func (c *Console) serverError(w http.ResponseWriter, r *http.Request, err error) {
	c.log.Error("console: request failed", "path", r.URL.Path, "err", err)
	c.fail(w, r, strings.HasPrefix(r.URL.Path, "/api/"), http.StatusInternalServerError, err.Error())
}

// pageSize reads ?limit=, defaulting to DefaultPageSize and capped at MaxPageSize.
func pageSize(r *http.Request) (int, error) {
	s := r.URL.Query().Get("limit")
	if s == "" {
		return DefaultPageSize, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("limit must be a whole number from 1 to %d, got %q", MaxPageSize, s)
	}
	return min(n, MaxPageSize), nil
}

// action logs a state change: who did what, and the outcome.
func (c *Console) action(r *http.Request, what string, attrs ...any) {
	p := principalOf(r.Context())
	c.log.Info("console: "+what, append([]any{"who", p.name, "remote", r.RemoteAddr}, attrs...)...)
}

func ageSeconds(now, t time.Time) *float64 {
	if t.IsZero() {
		return nil
	}
	s := max(now.Sub(t).Seconds(), 0)
	return &s
}
