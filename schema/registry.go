package schema

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/riferrei/srclient"
	"golang.org/x/sync/singleflight"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/internal/backoff"
)

// Registry defaults.
const (
	// DefaultRequestTimeout bounds one HTTP request to the registry.
	DefaultRequestTimeout = 5 * time.Second
	// DefaultMaxAttempts is how many times a request is tried while the registry is
	// unreachable before ErrRegistryUnavailable is returned.
	DefaultMaxAttempts = 4
	// DefaultMinBackoff is the wait before the first retry; it doubles up to DefaultMaxBackoff,
	// with jitter.
	DefaultMinBackoff = 100 * time.Millisecond
	// DefaultMaxBackoff caps the wait between retries.
	DefaultMaxBackoff = 2 * time.Second
)

// RegistryConfig configures a [Registry]. The zero value is invalid: URL is required.
type RegistryConfig struct {
	// URL is the registry's base URL, "https://registry.example:8081". It must not carry
	// credentials; use Username and Password. Required.
	URL string
	// Name is written into SchemaRef.Registry of the events the serializer fills. Defaults to
	// URL.
	Name string
	// Username is the basic-auth user. Defaults to none (no authentication).
	Username string
	// Password is the basic-auth password: a secret, never printed by String or in errors.
	// Defaults to none; required when Username is set.
	Password string
	// CAFile is a PEM file of CA certificates to trust instead of the system pool. Defaults to
	// the system pool.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and key for mutual TLS. Defaults to
	// none; both or neither must be set.
	CertFile string
	// KeyFile is the client certificate's PEM private key. Defaults to none.
	KeyFile string
	// RequestTimeout bounds one HTTP request. Defaults to [DefaultRequestTimeout].
	RequestTimeout time.Duration
	// MaxAttempts is how many times a request is tried while the registry is unreachable
	// (connection errors, timeouts, HTTP 5xx and 429). Defaults to [DefaultMaxAttempts].
	MaxAttempts int
	// MinBackoff is the wait before the first retry; it doubles per retry up to MaxBackoff,
	// with equal jitter (each wait drawn from its upper half), keiro's one retry delay
	// (keiro.Backoff). Defaults to [DefaultMinBackoff].
	MinBackoff time.Duration
	// MaxBackoff caps the wait between retries. Defaults to [DefaultMaxBackoff].
	MaxBackoff time.Duration
	// HTTPClient replaces the client built from the TLS fields (which must then be empty);
	// its Timeout is left as is. Defaults to a client built from CAFile, CertFile, KeyFile and
	// RequestTimeout.
	HTTPClient *http.Client
}

// String describes the configuration with the password redacted.
func (c RegistryConfig) String() string {
	pw := ""
	if c.Password != "" {
		pw = "[REDACTED]"
	}
	return fmt.Sprintf("RegistryConfig{URL:%q Name:%q Username:%q Password:%q CAFile:%q CertFile:%q KeyFile:%q RequestTimeout:%s MaxAttempts:%d MinBackoff:%s MaxBackoff:%s}",
		c.URL, c.Name, c.Username, pw, c.CAFile, c.CertFile, c.KeyFile, c.RequestTimeout, c.MaxAttempts, c.MinBackoff, c.MaxBackoff)
}

// GoString is String, so that %#v does not print the password either.
func (c RegistryConfig) GoString() string { return c.String() }

func (c *RegistryConfig) setDefaults() {
	c.URL = strings.TrimRight(c.URL, "/")
	if c.Name == "" {
		c.Name = c.URL
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
}

func (c *RegistryConfig) validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("URL: required (the schema registry's base URL, e.g. http://localhost:8081)"))
	} else if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("URL: %q is not an http(s) URL", redactURL(c.URL)))
	} else if u.User != nil {
		errs = append(errs, errors.New("URL: must not contain credentials; set Username and Password instead"))
	}
	if (c.Username == "") != (c.Password == "") {
		errs = append(errs, errors.New("Username, Password: set both or neither"))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("CertFile, KeyFile: set both or neither"))
	}
	if c.HTTPClient != nil && (c.CAFile != "" || c.CertFile != "") {
		errs = append(errs, errors.New("HTTPClient: cannot be combined with CAFile/CertFile; configure TLS on the client"))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("RequestTimeout: %s is negative", c.RequestTimeout))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("MaxAttempts: %d, want at least 1", c.MaxAttempts))
	}
	if c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff {
		errs = append(errs, fmt.Errorf("MinBackoff, MaxBackoff: want 0 <= MinBackoff (%s) <= MaxBackoff (%s)", c.MinBackoff, c.MaxBackoff))
	}
	return errors.Join(errs...)
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}

// httpClient builds the HTTP client: TLS from the files, and a transport that turns
// "unavailable" HTTP answers into errors so that they are classified before srclient sees them.
func (c *RegistryConfig) httpClient() (*http.Client, error) {
	if c.HTTPClient != nil {
		cl := *c.HTTPClient
		base := cl.Transport
		if base == nil {
			base = http.DefaultTransport
		}
		cl.Transport = statusTransport{base: base}
		return &cl, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if c.CAFile != "" || c.CertFile != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			if err != nil {
				return nil, fmt.Errorf("read registry CA file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("read registry CA file %s: no PEM certificate found", c.CAFile)
			}
			tc.RootCAs = pool
		}
		if c.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("load registry client certificate: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		tr.TLSClientConfig = tc
	}
	return &http.Client{Transport: statusTransport{base: tr}, Timeout: c.RequestTimeout}, nil
}

// httpStatusError is an HTTP answer that means "the registry is not serving us": 5xx, 429,
// 408, 401, 403.
type httpStatusError struct {
	Status int
	Body   string
}

func (e *httpStatusError) Error() string {
	msg := fmt.Sprintf("HTTP %d %s", e.Status, http.StatusText(e.Status))
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

type statusTransport struct{ base http.RoundTripper }

func (t statusTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	switch s := resp.StatusCode; {
	case s >= 500, s == http.StatusTooManyRequests, s == http.StatusRequestTimeout,
		s == http.StatusUnauthorized, s == http.StatusForbidden:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_ = resp.Body.Close()
		return nil, &httpStatusError{Status: s, Body: strings.TrimSpace(string(body))}
	}
	return resp, nil
}

// CloseIdleConnections closes the base transport's idle connections, so that Registry.Close
// (http.Client.CloseIdleConnections, which looks for this method) reaches them.
func (t statusTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// registryAPI is the part of srclient's client that the cache uses; it is declared here,
// where it is consumed, so that the registry's HTTP dialect stays srclient's business.
type registryAPI interface {
	GetSchema(schemaID int) (*srclient.Schema, error)
	LookupSchema(subject string, schema string, schemaType srclient.SchemaType, references ...srclient.Reference) (*srclient.Schema, error)
	CreateSchema(subject string, schema string, schemaType srclient.SchemaType, references ...srclient.Reference) (*srclient.Schema, error)
	GetSchemaByVersion(subject string, version int) (*srclient.Schema, error)
	GetLatestSchema(subject string) (*srclient.Schema, error)
}

// Schema is an Avro schema known to the registry, with its compiled codec.
type Schema struct {
	// ID is the registry's global schema id, the one in the Confluent frame.
	ID int
	// Subject is the subject it was looked up under; empty when fetched by id alone.
	Subject string
	// Version is its version under Subject; 0 when fetched by id alone.
	Version int
	// Text is the schema as the registry returned it.
	Text string
	// Fingerprint is [Fingerprint] of the codec.
	Fingerprint string

	*codecs
}

// codecs holds a schema's compiled codecs, shared by the cache entries of one schema text.
type codecs struct {
	codec     *goavro.Codec
	shape     *shape
	plainOnce sync.Once
	plain     *goavro.Codec
	plainErr  error
}

// Codec returns the goavro codec of the schema (Avro JSON encoding for textual data).
func (s *Schema) Codec() *goavro.Codec { return s.codec }

// plainCodec returns the codec whose textual form is plain JSON (unions without wrappers).
func (s *Schema) plainCodec() (*goavro.Codec, error) {
	s.plainOnce.Do(func() { s.plain, s.plainErr = goavro.NewCodecForStandardJSONFull(s.Text) })
	return s.plain, s.plainErr
}

// Registry is a caching Confluent Schema Registry client. Answers that never change are
// cached for the life of the Registry: schemas by id, by subject and version, and the
// (id, version) of a schema text under a subject, so steady-state encoding and decoding make
// no HTTP request. Concurrent misses for the same key make one request (singleflight).
// While the registry is unreachable, cached answers keep being served and misses are retried
// with capped exponential backoff before failing with [ErrRegistryUnavailable]. A Registry is
// safe for concurrent use.
type Registry struct {
	cfg    RegistryConfig
	httpc  *http.Client
	newAPI func(ctx context.Context) registryAPI
	flight singleflight.Group

	mu        sync.RWMutex
	byID      map[int]*Schema
	byVersion map[subjectVersion]*Schema
	byText    map[subjectText]*Schema
	compiled  map[string]*codecs // schema text → codecs
}

type subjectVersion struct {
	subject string
	version int
}

type subjectText struct {
	subject, text string
}

// NewRegistry returns a Registry for cfg, reporting every configuration problem at once. It
// makes no request.
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("schema registry config: %w", err)
	}
	hc, err := cfg.httpClient()
	if err != nil {
		return nil, fmt.Errorf("schema registry config: %w", err)
	}
	r := &Registry{
		cfg:       cfg,
		httpc:     hc,
		byID:      make(map[int]*Schema),
		byVersion: make(map[subjectVersion]*Schema),
		byText:    make(map[subjectText]*Schema),
		compiled:  make(map[string]*codecs),
	}
	r.newAPI = r.srclientFor
	return r, nil
}

// srclientFor returns a srclient client whose requests carry ctx (srclient itself takes no
// context). The client is cheap: the HTTP client and its connections are shared; srclient's
// own cache is off because ours is the one that matters.
func (r *Registry) srclientFor(ctx context.Context) registryAPI {
	c := srclient.NewSchemaRegistryClient(r.cfg.URL,
		srclient.WithClient(r.httpc),
		srclient.WithPreReqFn(func(req *http.Request) error {
			*req = *req.WithContext(ctx)
			return nil
		}))
	c.CachingEnabled(false)
	if r.cfg.Username != "" {
		c.SetCredentials(r.cfg.Username, r.cfg.Password)
	}
	return c
}

// Name is the registry's configured name (RegistryConfig.Name).
func (r *Registry) Name() string { return r.cfg.Name }

// Close releases idle connections. The Registry stays usable.
func (r *Registry) Close() { r.httpc.CloseIdleConnections() }

// compile returns the shared codecs of a schema text, compiling it once.
func (r *Registry) compile(text string) (*codecs, error) {
	r.mu.RLock()
	c := r.compiled[text]
	r.mu.RUnlock()
	if c != nil {
		return c, nil
	}
	codec, err := goavro.NewCodec(text)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSchema, err)
	}
	sh, err := newShape(codec.CanonicalSchema())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSchema, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.compiled[text]; c != nil {
		return c, nil
	}
	c = &codecs{codec: codec, shape: sh}
	r.compiled[text] = c
	return c, nil
}

func (r *Registry) newSchema(s *srclient.Schema, subject string) (*Schema, error) {
	c, err := r.compile(s.Schema())
	if err != nil {
		return nil, err
	}
	return &Schema{ID: s.ID(), Subject: subject, Version: s.Version(), Text: s.Schema(),
		Fingerprint: Fingerprint(c.codec), codecs: c}, nil
}

// SchemaByID returns the schema with the registry's global id, the writer schema of a
// Confluent frame. Errors: ErrUnknownSchemaID if the registry does not know the id
// (permanent), ErrRegistryUnavailable (retryable).
func (r *Registry) SchemaByID(ctx context.Context, id int) (*Schema, error) {
	r.mu.RLock()
	s := r.byID[id]
	r.mu.RUnlock()
	if s != nil {
		return s, nil
	}
	op := fmt.Sprintf("fetch schema id %d", id)
	return flight(ctx, &r.flight, "id\x00"+strconv.Itoa(id), func() (*Schema, error) {
		got, err := retry(ctx, r, op, ErrUnknownSchemaID, func(api registryAPI) (*srclient.Schema, error) {
			return api.GetSchema(id)
		})
		if err != nil {
			return nil, err
		}
		s, err := r.newSchema(got, "")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		r.mu.Lock()
		r.byID[id] = s
		r.mu.Unlock()
		return s, nil
	})
}

// LookupSchema returns the id and version under which text is registered in subject,
// without registering anything. Errors: ErrSubjectNotFound naming the subject (permanent until
// someone registers the schema), ErrRegistryUnavailable (retryable).
func (r *Registry) LookupSchema(ctx context.Context, subject, text string) (*Schema, error) {
	key := subjectText{subject, text}
	r.mu.RLock()
	s := r.byText[key]
	r.mu.RUnlock()
	if s != nil {
		return s, nil
	}
	op := fmt.Sprintf("look up schema in subject %s", subject)
	return flight(ctx, &r.flight, "text\x00"+subject+"\x00"+text, func() (*Schema, error) {
		got, err := retry(ctx, r, op, ErrSubjectNotFound, func(api registryAPI) (*srclient.Schema, error) {
			return api.LookupSchema(subject, text, srclient.Avro)
		})
		if err != nil {
			return nil, err
		}
		return r.remember(op, key, got)
	})
}

// RegisterSchema registers text under subject (a no-op returning the existing id and version
// if it is already there). Errors: ErrIncompatibleSchema, ErrInvalidSchema (permanent),
// ErrRegistryUnavailable (retryable).
func (r *Registry) RegisterSchema(ctx context.Context, subject, text string) (*Schema, error) {
	key := subjectText{subject, text}
	r.mu.RLock()
	s := r.byText[key]
	r.mu.RUnlock()
	if s != nil {
		return s, nil
	}
	if _, err := r.compile(text); err != nil {
		return nil, fmt.Errorf("register schema in subject %s: %w", subject, err)
	}
	op := fmt.Sprintf("register schema in subject %s", subject)
	return flight(ctx, &r.flight, "register\x00"+subject+"\x00"+text, func() (*Schema, error) {
		// POST /subjects/{s}/versions answers only the id; the lookup that follows gives the
		// version too (and is what Confluent's own serializers do).
		if _, err := retry(ctx, r, op, ErrSubjectNotFound, func(api registryAPI) (*srclient.Schema, error) {
			return api.CreateSchema(subject, text, srclient.Avro)
		}); err != nil {
			return nil, err
		}
		got, err := retry(ctx, r, op, ErrSubjectNotFound, func(api registryAPI) (*srclient.Schema, error) {
			return api.LookupSchema(subject, text, srclient.Avro)
		})
		if err != nil {
			return nil, err
		}
		return r.remember(op, key, got)
	})
}

func (r *Registry) remember(op string, key subjectText, got *srclient.Schema) (*Schema, error) {
	s, err := r.newSchema(got, key.subject)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	r.mu.Lock()
	r.byText[key] = s
	r.byVersion[subjectVersion{key.subject, s.Version}] = s
	if _, ok := r.byID[s.ID]; !ok {
		r.byID[s.ID] = &Schema{ID: s.ID, Text: s.Text, Fingerprint: s.Fingerprint, codecs: s.codecs}
	}
	r.mu.Unlock()
	return s, nil
}

// SchemaByVersion returns version of subject. Errors: ErrSubjectNotFound (permanent),
// ErrRegistryUnavailable (retryable).
func (r *Registry) SchemaByVersion(ctx context.Context, subject string, version int) (*Schema, error) {
	key := subjectVersion{subject, version}
	r.mu.RLock()
	s := r.byVersion[key]
	r.mu.RUnlock()
	if s != nil {
		return s, nil
	}
	op := fmt.Sprintf("fetch subject %s version %d", subject, version)
	return flight(ctx, &r.flight, "version\x00"+subject+"\x00"+strconv.Itoa(version), func() (*Schema, error) {
		got, err := retry(ctx, r, op, ErrSubjectNotFound, func(api registryAPI) (*srclient.Schema, error) {
			return api.GetSchemaByVersion(subject, version)
		})
		if err != nil {
			return nil, err
		}
		s, err := r.newSchema(got, subject)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		r.mu.Lock()
		r.byVersion[key] = s
		r.mu.Unlock()
		return s, nil
	})
}

// LatestSchema returns the latest version of subject. It is never cached: the latest version
// changes when someone registers a new one.
func (r *Registry) LatestSchema(ctx context.Context, subject string) (*Schema, error) {
	op := fmt.Sprintf("fetch latest version of subject %s", subject)
	got, err := retry(ctx, r, op, ErrSubjectNotFound, func(api registryAPI) (*srclient.Schema, error) {
		return api.GetLatestSchema(subject)
	})
	if err != nil {
		return nil, err
	}
	s, err := r.newSchema(got, subject)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return s, nil
}

// Compatibility is the registry's verdict on a candidate schema.
type Compatibility struct {
	// Compatible reports whether the schema may be registered under the subject.
	Compatible bool
	// Messages are the registry's reasons when it is not (verbose mode), or a note.
	Messages []string
}

// CheckCompatibility asks the registry whether text is compatible with the latest version of
// subject under the subject's compatibility rule. A subject with no version yet is
// compatible. The request is made directly (srclient's IsSchemaCompatible drops the reasons),
// with the same HTTP client, credentials and retries.
func (r *Registry) CheckCompatibility(ctx context.Context, subject, text string) (Compatibility, error) {
	if _, err := r.compile(text); err != nil {
		return Compatibility{}, fmt.Errorf("check compatibility for subject %s: %w", subject, err)
	}
	op := fmt.Sprintf("check compatibility for subject %s", subject)
	var out Compatibility
	_, err := retry(ctx, r, op, ErrSubjectNotFound, func(registryAPI) (*srclient.Schema, error) {
		body, _ := json.Marshal(map[string]string{"schema": text})
		u := r.cfg.URL + "/compatibility/subjects/" + url.PathEscape(subject) + "/versions/latest?verbose=true"
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if r.cfg.Username != "" {
			req.SetBasicAuth(r.cfg.Username, r.cfg.Password)
		}
		resp, err := r.httpc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return nil, err
		}
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			e := srclient.Error{}
			if json.Unmarshal(raw, &e) != nil || e.Code == 0 {
				return nil, fmt.Errorf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
			}
			return nil, fmt.Errorf("%w (%s)", &srError{code: e.Code}, e.Message)
		}
		var v struct {
			IsCompatible *bool    `json:"is_compatible"`
			Messages     []string `json:"messages"`
		}
		if err := json.Unmarshal(raw, &v); err != nil || v.IsCompatible == nil {
			return nil, fmt.Errorf("unexpected answer %q", truncate(string(raw), 200))
		}
		out = Compatibility{Compatible: *v.IsCompatible, Messages: v.Messages}
		return nil, nil
	})
	if errors.Is(err, ErrSubjectNotFound) {
		return Compatibility{Compatible: true, Messages: []string{"subject " + subject + " has no version yet"}}, nil
	}
	if err != nil {
		return Compatibility{}, err
	}
	return out, nil
}

// srError carries a registry error code from a direct request.
type srError struct{ code int }

func (e *srError) Error() string { return "registry error code " + strconv.Itoa(e.code) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// retry runs call until it succeeds, fails permanently, or MaxAttempts is reached while the
// registry is unavailable, waiting with capped exponential backoff and jitter in between.
// notFound is the sentinel a 404 maps to.
func retry(ctx context.Context, r *Registry, op string, notFound error, call func(registryAPI) (*srclient.Schema, error)) (*srclient.Schema, error) {
	wait := keiro.Backoff{Initial: r.cfg.MinBackoff, Max: r.cfg.MaxBackoff, Multiplier: keiro.DefaultMultiplier}
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		got, err := call(r.newAPI(ctx))
		if err == nil {
			return got, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("%s: %w (last error: %v)", op, cerr, err)
		}
		rerr := classify(op, err, notFound)
		if !rerr.retryable() || attempt >= r.cfg.MaxAttempts {
			if errors.Is(rerr.Kind, ErrRegistryUnavailable) {
				rerr.Op = fmt.Sprintf("%s (%d %s)", op, attempt, plural(attempt, "attempt", "attempts"))
			}
			return nil, rerr
		}
		if err := backoff.Sleep(ctx, wait.Delay(attempt)); err != nil {
			return nil, fmt.Errorf("%s: %w (last error: %v)", op, err, rerr)
		}
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func (e *RegistryError) retryable() bool {
	return errors.Is(e.Kind, ErrRegistryUnavailable) && e.Status != http.StatusUnauthorized && e.Status != http.StatusForbidden
}

// classify maps an error from srclient or the HTTP client onto a RegistryError.
func classify(op string, err error, notFound error) *RegistryError {
	re := &RegistryError{Op: op, Err: err}
	var hs *httpStatusError
	var se srclient.Error
	var de *srError
	var ne net.Error
	switch {
	case errors.As(err, &hs):
		re.Kind, re.Status = ErrRegistryUnavailable, hs.Status
		if hs.Status == http.StatusUnauthorized || hs.Status == http.StatusForbidden {
			re.Err = fmt.Errorf("%w; check the registry user and password", err)
		}
	case errors.As(err, &se):
		re.Code = se.Code
		re.Kind = kindOfCode(se.Code, notFound)
	case errors.As(err, &de):
		re.Code = de.code
		re.Kind = kindOfCode(de.code, notFound)
	case errors.As(err, &ne), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		re.Kind = ErrRegistryUnavailable
	default:
		// srclient reports a non-JSON error body as the bare HTTP status ("404 Not Found").
		if f := strings.Fields(err.Error()); len(f) > 0 {
			if st, convErr := strconv.Atoi(f[0]); convErr == nil {
				re.Status = st
				re.Kind = kindOfCode(st*100, notFound)
			}
		}
	}
	return re
}

func kindOfCode(code int, notFound error) error {
	switch {
	case code == 40403 && errors.Is(notFound, ErrUnknownSchemaID):
		return ErrUnknownSchemaID
	case code/100 == 404:
		return notFound
	case code == 409 || code/100 == 409:
		return ErrIncompatibleSchema
	case code/100 == 422:
		return ErrInvalidSchema
	case code/10000 == 5:
		return ErrRegistryUnavailable
	}
	return nil
}

// flight runs fn once per key among concurrent callers. A caller whose own context is alive
// does not inherit another caller's cancellation: it tries again.
func flight(ctx context.Context, g *singleflight.Group, key string, fn func() (*Schema, error)) (*Schema, error) {
	for {
		v, err, _ := g.Do(key, func() (any, error) { return fn() })
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, ErrRegistryUnavailable) &&
				(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
				continue // the leader's context ended, not ours
			}
			return nil, err
		}
		return v.(*Schema), nil
	}
}
