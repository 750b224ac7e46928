package handlers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"

	"go.opentelemetry.io/otel/propagation"
	"golang.org/x/net/http/httpguts"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// ErrInvalidHeaderValue reports a request header whose value, taken from the event, the HTTP
// client refuses to send: a control character (a newline in a message id, say). HTTP has no
// escape for it in headers such as Idempotency-Key or Content-Type, and the same message would
// fail the same way on every retry, so the handler returns it wrapped as permanent. (The ce-*
// attributes of CloudEvents binary mode are percent-encoded instead and never fail this way.)
var ErrInvalidHeaderValue = errors.New("invalid HTTP header value")

// headerField is a request header the handler sets, with where its value comes from.
type headerField struct {
	name  string
	value string
	// from says which fields the value comes from, for the error.
	from string
}

// requestHeader is the one place the header of ev's request is built: the configured headers
// (checked by NewHTTP), the ce-* attributes percent-encoded as the CloudEvents HTTP binding
// asks, then the fields taken from the event (Content-Type, Idempotency-Key) and the trace
// context, each checked the way the HTTP client checks them before sending. A value it would
// refuse is this message's failure: [ErrInvalidHeaderValue], permanent.
func (h *HTTP) requestHeader(ctx context.Context, ev envelope.Event, enc encoded) (http.Header, error) {
	hdr := h.header.Clone() // without the handler's own headers (NewHTTP)
	if hdr == nil {
		hdr = http.Header{}
	}
	for _, a := range enc.ce {
		hdr[http.CanonicalHeaderKey("ce-"+a.name)] = []string{percentEncodeCE(a.value)}
	}
	fields := make([]headerField, 0, 4)
	if enc.contentType != "" {
		fields = append(fields, headerField{"Content-Type", enc.contentType, enc.contentTypeFrom})
	}
	fields = append(fields, headerField{HeaderIdempotencyKey, h.IdempotencyKey(ctx, ev), "the consumer name, the event's source and its dedupe key (by default the message id)"})
	tc := http.Header{}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(tc))
	for k, vs := range tc {
		for _, v := range vs {
			fields = append(fields, headerField{k, v, "the trace context of the record"})
		}
	}
	for _, f := range fields {
		if i := invalidHeaderByte(f.value); i >= 0 {
			return nil, inbox.Permanent(fmt.Errorf("header %s of message %q: %w: byte %d is %#02x, which HTTP does not allow in a header; the value comes from %s: correct the producer (this message goes to the dead-letter topic)",
				f.name, ev.MessageID, ErrInvalidHeaderValue, i, f.value[i], f.from))
		}
		hdr[http.CanonicalHeaderKey(f.name)] = append(hdr[http.CanonicalHeaderKey(f.name)], f.value)
	}
	return hdr, nil
}

// invalidHeaderByte returns the index of the first byte the HTTP client refuses in a header
// value (a control character other than tab), or -1.
func invalidHeaderByte(v string) int {
	if httpguts.ValidHeaderFieldValue(v) {
		return -1
	}
	for i := 0; i < len(v); i++ {
		if b := v[i]; b < ' ' && b != '\t' || b == 0x7f {
			return i
		}
	}
	return -1 // not reached
}

// validateHeader checks configured headers once, without echoing their (secret) values.
func validateHeader(hdr http.Header) []error {
	var errs []error
	for k, vs := range hdr {
		if !httpguts.ValidHeaderFieldName(k) {
			errs = append(errs, fmt.Errorf("Header name %q is not a valid HTTP header name", k))
			continue
		}
		for _, v := range vs {
			if invalidHeaderByte(v) >= 0 {
				errs = append(errs, fmt.Errorf("Header %s has a value with a control character, which HTTP does not allow", k))
			}
		}
	}
	return errs
}

// percentEncodeCE encodes a ce-* header value as the CloudEvents HTTP binding (binary mode)
// asks: every byte outside printable US-ASCII (U+0021 to U+007E), and '"' and '%', becomes
// %XX (RFC 3986 §2.1). A value that is not UTF-8 (a binary Kafka key) is encoded byte for byte,
// so percent-decoding gives back its exact bytes.
func percentEncodeCE(v string) string {
	n := 0
	for i := 0; i < len(v); i++ {
		if ceEscape(v[i]) {
			n++
		}
	}
	if n == 0 {
		return v
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(v)+2*n)
	for i := 0; i < len(v); i++ {
		c := v[i]
		if ceEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
			continue
		}
		b = append(b, c)
	}
	return string(b)
}

func ceEscape(c byte) bool { return c < 0x21 || c > 0x7e || c == '"' || c == '%' }

// sendTrace records how far the client got with a request.
type sendTrace struct {
	wrote atomic.Bool // a byte of the request was written towards the target
	// conn: the client got a connection (new or reused), so the request passed the client's
	// own checks; a failure from here on (a reused connection the server closed meanwhile)
	// is the target's or the network's.
	conn atomic.Bool
}

// withSendTrace returns ctx with a client trace that records into st.
func withSendTrace(ctx context.Context, st *sendTrace) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaderField: func(string, []string) { st.wrote.Store(true) },
		GotConn:          func(httptrace.GotConnInfo) { st.conn.Store(true) },
	})
}

// isTransportFailure reports whether an error of client.Do is a failure of the network or of
// the target, the same for every message: no connection (refused, unreachable, DNS, a timeout),
// the connection lost or closed without an answer, a TLS or scheme mismatch, or any failure
// after the request started to be written (a malformed answer). Everything else (the client
// refusing the request before sending it, a proxy function's error) is not an outage.
func isTransportFailure(err error, st *sendTrace) bool {
	if st.wrote.Load() || st.conn.Load() {
		return true
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // *url.Error is a net.Error itself, whatever it wraps
	}
	var (
		ne    net.Error
		errno syscall.Errno
		rh    tls.RecordHeaderError
		cv    *tls.CertificateVerificationError
		alert tls.AlertError
		ua    x509.UnknownAuthorityError
		hn    x509.HostnameError
		ci    x509.CertificateInvalidError
	)
	return errors.As(err, &ne) || errors.As(err, &errno) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, http.ErrSchemeMismatch) ||
		errors.As(err, &rh) || errors.As(err, &cv) || errors.As(err, &alert) ||
		errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci)
}

// redactor removes the secrets of the endpoint URL (its userinfo and query) and of the
// configured headers from error text.
type redactor struct {
	safeURL string   // scheme://host/path
	secrets []string // longest first
}

// minSecret is the shortest query value, user name or configured header value that is
// redacted on its own: shorter ones ("?v=1") are rarely secrets, and replacing them everywhere
// would garble the rest of the text ("127.0.0.1"). The whole userinfo, the whole query and
// the password are redacted whatever their length.
const minSecret = 4

func newRedactor(u *url.URL, hdr http.Header) redactor {
	safe := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	r := redactor{safeURL: safe.String()}
	add := func(s string, least int) {
		if s != "" && len(s) >= least {
			r.secrets = append(r.secrets, s)
		}
	}
	if u.User != nil {
		add(u.User.String(), 1)
		add(base64.StdEncoding.EncodeToString([]byte(u.User.String())), 1) // as Basic auth
		pw, _ := u.User.Password()
		add(pw, 1)
		add(u.User.Username(), minSecret)
	}
	add(u.RawQuery, 1)
	add(u.Fragment, 1)
	for _, vs := range u.Query() {
		for _, v := range vs {
			add(v, minSecret)
			add(url.QueryEscape(v), minSecret)
		}
	}
	for _, vs := range hdr {
		for _, v := range vs {
			add(v, minSecret)
		}
	}
	// Longest first, so a secret that contains another is removed whole.
	sort.SliceStable(r.secrets, func(i, j int) bool { return len(r.secrets[i]) > len(r.secrets[j]) })
	return r
}

// longest is the length of the longest secret, 0 without any.
func (r redactor) longest() int {
	if len(r.secrets) == 0 {
		return 0
	}
	return len(r.secrets[0])
}

// text returns s with every secret of the URL replaced by "REDACTED".
func (r redactor) text(s string) string {
	for _, sec := range r.secrets {
		s = strings.ReplaceAll(s, sec, "REDACTED")
	}
	return s
}

// clientError returns err of client.Do with the URL's secrets removed: a *url.Error names the
// request URL (Go hides only the password), and the cause may quote it too.
func (r redactor) clientError(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return &redactedError{text: r.text(err.Error()), err: err}
	}
	return &url.Error{Op: ue.Op, URL: r.safeURL, Err: &redactedError{text: r.text(ue.Err.Error()), err: ue.Err}}
}

// redactedError is an error whose text has the URL's secrets removed; it unwraps to the
// original, so errors.Is and errors.As still classify it.
type redactedError struct {
	text string
	err  error
}

func (e *redactedError) Error() string { return e.text }
func (e *redactedError) Unwrap() error { return e.err }
