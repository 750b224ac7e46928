package handlers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/net/http/httpguts"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// Defaults of [HTTPConfig].
const (
	// DefaultHTTPTimeout bounds one delivery request, response included.
	DefaultHTTPTimeout = 10 * time.Second
	// DefaultMaxErrorBody is how many bytes of a failed response's body an error keeps.
	DefaultMaxErrorBody = 512
)

// HeaderIdempotencyKey is the request header that carries the delivery's idempotency key.
const HeaderIdempotencyKey = "Idempotency-Key"

// maxDrain bounds how much of a successful response body is read (to reuse the connection).
const maxDrain = 64 << 10

// HTTPConfig configures [NewHTTP].
type HTTPConfig struct {
	// URL is the endpoint each event is POSTed to; its scheme (http or https) selects TLS.
	// Its userinfo and query may hold secrets: the handler's errors name only its scheme, host
	// and path. Required.
	URL string
	// Consumer is the inbox consumer name, the first part of the Idempotency-Key. Required.
	Consumer string
	// Timeout bounds one request, reading the response included; a timeout is retried.
	// Defaults to DefaultHTTPTimeout.
	Timeout time.Duration
	// Header holds extra request headers, for example Authorization. Their values are treated
	// as secrets and never appear in errors; a value with a control character is refused by
	// NewHTTP. Content-Type, Idempotency-Key, traceparent and tracestate (and the ce-*
	// attributes in FormatCloudEventsBinary) are always set by the handler and cannot be
	// overridden. Defaults to none.
	Header http.Header
	// Client sends the requests; its Timeout and CheckRedirect are left alone, so set them
	// yourself when you pass one. Defaults to a client on a clone of http.DefaultTransport that
	// does not follow redirects (a redirect answer is permanent).
	Client *http.Client
	// DecodePayload turns non-JSON payloads (Avro) into JSON. Defaults to nil: non-JSON
	// payloads are sent as base64 with "payload_encoding": "base64".
	DecodePayload PayloadDecoder
	// DedupeKey returns the part of the Idempotency-Key that identifies the message; it must
	// be the inbox's dedupe key so that the service and the inbox agree on what a duplicate
	// is. Defaults to the event's MessageID (the inbox's default policy).
	DedupeKey func(ctx context.Context, ev envelope.Event) string
	// MaxErrorBody bounds how many bytes of a failed response's body an error keeps.
	// Defaults to DefaultMaxErrorBody.
	MaxErrorBody int
	// Format is the request body: FormatKeiro, FormatCloudEventsStructured or
	// FormatCloudEventsBinary. Defaults to FormatKeiro.
	Format string
}

func (c *HTTPConfig) setDefaults() {
	if c.Timeout == 0 {
		c.Timeout = DefaultHTTPTimeout
	}
	if c.MaxErrorBody == 0 {
		c.MaxErrorBody = DefaultMaxErrorBody
	}
	if c.DedupeKey == nil {
		c.DedupeKey = func(_ context.Context, ev envelope.Event) string { return ev.MessageID }
	}
	if c.Client == nil {
		c.Client = &http.Client{
			Transport:     http.DefaultTransport.(*http.Transport).Clone(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
}

func (c *HTTPConfig) validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("URL is required"))
	} else if u, err := url.Parse(c.URL); err != nil {
		errs = append(errs, errors.New("URL is not a valid URL")) // err may echo credentials
	} else if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		errs = append(errs, fmt.Errorf("URL must be an absolute http:// or https:// URL, got scheme %q", u.Scheme))
	} else if !httpguts.ValidHostHeader(u.Host) {
		errs = append(errs, errors.New("URL has a host that is not valid in HTTP"))
	} else if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			errs = append(errs, fmt.Errorf("URL port %q is not a port number (1 to 65535)", p))
		}
	}
	if c.Consumer == "" {
		errs = append(errs, errors.New("Consumer is required (it is part of the Idempotency-Key)"))
	} else if invalidHeaderByte(c.Consumer) >= 0 {
		errs = append(errs, fmt.Errorf("Consumer %q has a control character, which the Idempotency-Key header cannot carry", c.Consumer))
	}
	errs = append(errs, validateHeader(c.Header)...)
	if !validFormat(c.Format) {
		errs = append(errs, fmt.Errorf("Format %q is not %s, %s or %s", c.Format, FormatKeiro, FormatCloudEventsStructured, FormatCloudEventsBinary))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout must not be negative, got %s", c.Timeout))
	}
	if c.MaxErrorBody < 0 {
		errs = append(errs, fmt.Errorf("MaxErrorBody must not be negative, got %d", c.MaxErrorBody))
	}
	return errors.Join(errs...)
}

// HTTP delivers each event as a JSON [Document] in a POST request. It gives at-least-once
// delivery to the service, which dedupes by the Idempotency-Key header (see the package doc).
type HTTP struct {
	cfg    HTTPConfig
	header http.Header // cfg.Header, checked, with the handler's own headers removed
	redact redactor
}

// NewHTTP validates cfg and returns the handler.
func NewHTTP(cfg HTTPConfig) (*HTTP, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("http handler config: %w", err)
	}
	u, _ := url.Parse(cfg.URL)
	hdr := cfg.Header.Clone()
	for _, k := range []string{"Content-Type", HeaderIdempotencyKey, envelope.HeaderTraceparent, envelope.HeaderTracestate} {
		hdr.Del(k)
	}
	return &HTTP{cfg: cfg, header: hdr, redact: newRedactor(u, hdr)}, nil
}

// CloseIdleConnections closes the idle keep-alive connections of the handler's client; call
// it when the consumer stops.
func (h *HTTP) CloseIdleConnections() { h.cfg.Client.CloseIdleConnections() }

// IdempotencyKey returns the Idempotency-Key sent for ev: <consumer>:<source>:<dedupe key>.
func (h *HTTP) IdempotencyKey(ctx context.Context, ev envelope.Event) string {
	return h.cfg.Consumer + ":" + ev.Source + ":" + h.cfg.DedupeKey(ctx, ev)
}

// Handle POSTs ev to the configured URL. It has the inbox Handler signature; tx is not used,
// because the HTTP effect cannot join the transaction. A nil result means the service answered
// 2xx. An unreachable or overloaded target (no answer, 429, 502, 503, 504) is an
// [inbox.Outage]: no attempt is used. An event the request cannot carry (a header value the
// client would refuse, text a JSON body cannot hold, invalid JSON) is permanent. Other errors
// are classified as described in the package doc. Errors never carry the URL's userinfo or
// query.
func (h *HTTP) Handle(ctx context.Context, _ pgx.Tx, ev envelope.Event) error {
	enc, err := encodeRequest(ctx, h.cfg.Format, ev, h.cfg.DecodePayload)
	if err != nil {
		return err
	}
	hdr, err := h.requestHeader(ctx, ev, enc)
	if err != nil {
		return err
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	var st sendTrace
	req, err := http.NewRequestWithContext(withSendTrace(ctx, &st), http.MethodPost, h.cfg.URL, bytes.NewReader(enc.body))
	if err != nil {
		// Not reached: NewHTTP parsed the same URL.
		return fmt.Errorf("build request to %s: %w", h.redact.safeURL, h.redact.clientError(err))
	}
	req.Header = hdr

	resp, err := h.cfg.Client.Do(req)
	if err != nil {
		transport := isTransportFailure(err, &st)
		err = fmt.Errorf("deliver message %q to %s: %w", ev.MessageID, h.redact.safeURL, h.redact.clientError(err))
		switch {
		case parent.Err() != nil:
			return err // the consumer is stopping
		case transport:
			// Timeouts, refused connections, resets, TLS failures, a malformed answer: the
			// target is unreachable, not the message at fault, so no attempt is used (an
			// operator can fix the configuration meanwhile).
			return inbox.Outage(err)
		}
		// The client refused the request before sending it. That is no outage of the target;
		// requestHeader already refuses what the client refuses for a header value, so what is
		// left uses an attempt and, if it recurs, ends in the dead-letter topic.
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
		return nil
	}
	serr := &StatusError{
		StatusCode: resp.StatusCode,
		Body:       h.errorBody(resp.Body),
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
	}
	err = fmt.Errorf("deliver message %q to %s: %w", ev.MessageID, h.redact.safeURL, serr)
	switch {
	case !serr.Retryable():
		return inbox.Permanent(err)
	case serr.Overloaded():
		return inbox.OutageRetryAfter(err, serr.RetryAfter)
	}
	return err
}

// errorBody reads the start of a failed response's body, at most MaxErrorBody bytes, with the
// URL's secrets removed (a body may echo the request URI), and drains the rest.
func (h *HTTP) errorBody(body io.Reader) string {
	// Read a secret's length more, so that one crossing the cut is removed whole.
	snippet, _ := io.ReadAll(io.LimitReader(body, int64(h.cfg.MaxErrorBody+h.redact.longest())))
	_, _ = io.Copy(io.Discard, io.LimitReader(body, maxDrain))
	s := h.redact.text(string(snippet))
	if len(s) > h.cfg.MaxErrorBody {
		s = s[:h.cfg.MaxErrorBody]
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// StatusError is a non-2xx answer of the HTTP endpoint.
type StatusError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Body is the start of the response body, at most HTTPConfig.MaxErrorBody bytes.
	Body string
	// RetryAfter is the Retry-After header's delay, zero when absent or unparsable.
	RetryAfter time.Duration
}

// Error returns "HTTP <status> <text>: <body snippet>".
func (e *StatusError) Error() string {
	s := "HTTP " + strconv.Itoa(e.StatusCode)
	if t := http.StatusText(e.StatusCode); t != "" {
		s += " " + t
	}
	if e.Body != "" {
		s += ": " + e.Body
	}
	return s
}

// Retryable reports whether the status is worth retrying: 408, 429 and 5xx.
func (e *StatusError) Retryable() bool {
	return e.StatusCode == http.StatusRequestTimeout || e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

// Overloaded reports a status that says the target, not the message, is the problem: 429 Too
// Many Requests, 502 Bad Gateway, 503 Service Unavailable, 504 Gateway Timeout. The handler
// reports those as an [inbox.Outage] (with the Retry-After delay), which uses no attempt.
func (e *StatusError) Overloaded() bool {
	switch e.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// RetryAfter returns the delay the HTTP endpoint asked for with Retry-After somewhere in err's
// chain, and whether it asked. Runners use it as a minimum backoff.
func RetryAfter(err error) (time.Duration, bool) {
	var se *StatusError
	if errors.As(err, &se) && se.RetryAfter > 0 {
		return se.RetryAfter, true
	}
	return 0, false
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP-date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > int64(24*time.Hour/time.Second) {
			n = int64(24 * time.Hour / time.Second)
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
