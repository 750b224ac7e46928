package handlers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// A message id with a newline becomes an Idempotency-Key that Go's HTTP client refuses to send.
// The same message fails the same way on every retry: it is the message's failure (permanent,
// naming the header and the message), never an outage that holds up the partition forever.
func TestHTTPControlCharacterInIdempotencyKeyIsPermanent(t *testing.T) {
	t.Parallel()
	for _, format := range []string{FormatKeiro, FormatCloudEventsStructured, FormatCloudEventsBinary} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
			h := newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Format = format })
			ev := testEvent()
			ev.MessageID = "bad\nid-1"
			err := h.Handle(context.Background(), nil, ev)
			require.Error(t, err)
			require.True(t, inbox.IsPermanent(err), "%v", err)
			require.False(t, inbox.IsOutage(err), "%v", err)
			require.ErrorIs(t, err, ErrInvalidHeaderValue)
			require.Contains(t, err.Error(), HeaderIdempotencyKey)
			require.Contains(t, err.Error(), `"bad\nid-1"`)
			require.Empty(t, seen, "nothing was sent")
		})
	}
}

// In CloudEvents binary mode the attributes taken from the event travel percent-encoded, as
// the CloudEvents HTTP binding asks: a binary Kafka key, a non-ASCII source, '%', '"' and
// spaces all arrive intact for a receiver that decodes them.
func TestHTTPCloudEventsBinaryPercentEncodesAttributes(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Format = FormatCloudEventsBinary })
	ev := testEvent()
	key := string([]byte{0xff, 0x00, 0x0a, 0x80})
	ev.Key = &key
	ev.Source = "Zürich orders"
	ev.MessageID = `50% "off"`
	ev.EventType = "Order\tPlaced\x7f"
	require.NoError(t, h.Handle(context.Background(), nil, ev))
	got := <-seen
	require.Equal(t, "%FF%00%0A%80", got.header.Get("Ce-Partitionkey"))
	require.Equal(t, "Z%C3%BCrich%20orders", got.header.Get("Ce-Source"))
	require.Equal(t, "50%25%20%22off%22", got.header.Get("Ce-Id"))
	for name, want := range map[string]string{"Ce-Partitionkey": key, "Ce-Source": ev.Source, "Ce-Id": ev.MessageID, "Ce-Type": ev.EventType} {
		dec, err := url.PathUnescape(got.header.Get(name))
		require.NoError(t, err, name)
		require.Equal(t, want, dec, name)
	}
	require.Equal(t, "1.0", got.header.Get("Ce-Specversion"))
	require.Equal(t, "2026-11-29T07:00:00Z", got.header.Get("Ce-Time"))
}

// The content type that binary mode sends as Content-Type comes from the event: a value the
// client refuses, or one that is not a media type (a CloudEvent's datacontenttype must be one),
// is the message's failure; an empty one sends no Content-Type.
func TestHTTPCloudEventsContentTypeFromEvent(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
	for _, format := range []string{FormatCloudEventsBinary, FormatCloudEventsStructured} {
		h := newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Format = format })
		for _, ct := range []string{"application/x-thing\r\nX-Injected: 1", "not a media type", "text/plain; charset"} {
			ev := testEvent()
			ev.ContentType, ev.Payload = ct, []byte{1, 2, 3}
			err := h.Handle(context.Background(), nil, ev)
			require.Error(t, err, "%s %q", format, ct)
			require.True(t, inbox.IsPermanent(err), "%s %q: %v", format, ct, err)
			require.Contains(t, err.Error(), "msg-1")
		}
		ev := testEvent()
		ev.ContentType, ev.Payload = "", []byte{1, 2, 3}
		require.NoError(t, h.Handle(context.Background(), nil, ev), format)
		got := <-seen
		if format == FormatCloudEventsBinary {
			require.Empty(t, got.header.Values("Content-Type"))
			require.Equal(t, ev.Payload, got.body)
		} else {
			var ce map[string]any
			require.NoError(t, json.Unmarshal(got.body, &ce))
			require.NotContains(t, ce, "datacontenttype")
		}
	}
	require.Empty(t, seen)
}

// A JSON document cannot carry a string that is not valid UTF-8 unchanged: json.Marshal would
// silently replace the bytes. A key that is not text travels as base64 with "key_encoding" in
// the keiro document; CloudEvents structured mode (partitionkey is a String) refuses it, and
// both refuse other such fields, naming them, instead of delivering another id.
func TestJSONDocumentCarriesOnlyText(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
	key := "\x00\x00\x00\x00\x07order-\xff" // a Confluent-framed key, say
	h := newHTTP(t, srv.URL)
	ev := testEvent()
	ev.Key = &key
	require.NoError(t, h.Handle(context.Background(), nil, ev))
	var doc map[string]any
	require.NoError(t, json.Unmarshal((<-seen).body, &doc))
	require.Equal(t, "base64", doc["key_encoding"])
	require.Equal(t, base64.StdEncoding.EncodeToString([]byte(key)), doc["key"])

	for _, format := range []string{FormatKeiro, FormatCloudEventsStructured} {
		h := newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Format = format })
		ev := testEvent()
		ev.Source = "order\xe9s"
		err := h.Handle(context.Background(), nil, ev)
		require.Error(t, err, format)
		require.True(t, inbox.IsPermanent(err), "%s: %v", format, err)
		require.ErrorIs(t, err, ErrInvalidUTF8)
		require.Contains(t, err.Error(), "source of message")

		ev = testEvent()
		ev.Payload = []byte("{\"note\": \"caf\xe9\"}") // JSON must be UTF-8 (RFC 8259)
		err = h.Handle(context.Background(), nil, ev)
		require.ErrorIs(t, err, ErrInvalidJSONPayload, format)
		require.True(t, inbox.IsPermanent(err), "%s: %v", format, err)
	}
	h = newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Format = FormatCloudEventsStructured })
	ev = testEvent()
	ev.Key = &key
	err := h.Handle(context.Background(), nil, ev)
	require.ErrorIs(t, err, ErrInvalidUTF8)
	require.True(t, inbox.IsPermanent(err), "%v", err)
	require.Empty(t, seen)
}

// Header names and values from the configuration are checked once, at NewHTTP, without
// echoing the (secret) values.
func TestHTTPConfigHeaderValidation(t *testing.T) {
	t.Parallel()
	for _, cfg := range []HTTPConfig{
		{URL: "http://127.0.0.1/x", Consumer: "c", Header: http.Header{"Authorization": {"Bearer s3cret\nX: y"}}},
		{URL: "http://127.0.0.1/x", Consumer: "c", Header: http.Header{"Bad Name": {"v"}}},
		{URL: "http://127.0.0.1/x", Consumer: "bill\ning"},
		{URL: "http://127.0.0.1:99999/x", Consumer: "c"},
	} {
		_, err := NewHTTP(cfg)
		require.Error(t, err, "%+v", cfg.Header)
		require.NotContains(t, err.Error(), "s3cret")
	}
}

// Anything the HTTP client refuses before sending is not an outage of the target: here the
// transport fails before it asks for a connection. Failures of the target or of the network
// (a malformed answer, a connection closed without one, a TLS or scheme mismatch) stay outages.
func TestHTTPClientErrorClassification(t *testing.T) {
	t.Parallel()
	srv, _ := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) {
		c.Client = &http.Client{Transport: &http.Transport{Proxy: func(*http.Request) (*url.URL, error) {
			return nil, errors.New("proxy configuration rejected the request")
		}}}
	})
	err := h.Handle(context.Background(), nil, testEvent())
	require.Error(t, err)
	require.False(t, inbox.IsOutage(err), "refused before sending: %v", err)

	garbage := listen(t, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 4096))
		_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n\r\n"))
	})
	closing := listen(t, func(net.Conn) {})
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	tlsSrv.Config.ErrorLog = discardLog()
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	for name, target := range map[string]string{
		"malformed answer":        "http://" + garbage + "/x",
		"closed without answer":   "http://" + closing + "/x",
		"https to a plain server": strings.Replace(srv.URL, "http://", "https://", 1),
		"untrusted certificate":   tlsSrv.URL,
	} {
		h := newHTTP(t, target, func(c *HTTPConfig) { c.Timeout = 5 * time.Second })
		err := h.Handle(context.Background(), nil, testEvent())
		require.Error(t, err, name)
		require.True(t, inbox.IsOutage(err), "%s: %v", name, err)
	}
}

// listen serves every connection with serve and closes it.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// A secret in the URL's query string or userinfo never reaches the handler's errors (which
// the consumer logs on every retry): neither from the client's error text nor from a body
// that echoes the request. Nor does a configured header's value.
func TestHTTPErrorsRedactURLSecrets(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		user, pw, _ := r.BasicAuth()
		_, _ = fmt.Fprintf(w, "failed %s %s for %s/%s (Authorization: %s)", r.Method, r.RequestURI, user, pw, r.Header.Get("Authorization"))
	}))
	t.Cleanup(echo.Close)
	for name, target := range map[string]string{"closed port": closed, "answers 500": echo.Listener.Addr().String()} {
		for _, hdr := range []http.Header{nil, {"Authorization": {"Bearer t0psecret"}}} {
			h := newHTTP(t, "http://user:pw@"+target+"/hook?token=s3cret&v=1", func(c *HTTPConfig) { c.Header = hdr })
			err := h.Handle(context.Background(), nil, testEvent())
			require.Error(t, err, name)
			msg := err.Error()
			for _, secret := range []string{"s3cret", "pw", "user", "dXNlcjpwdw", "t0psecret"} {
				require.NotContains(t, msg, secret, name)
			}
			require.Contains(t, msg, "http://"+target+"/hook", "%s: scheme, host and path are kept", name)
			if name == "closed port" {
				require.Contains(t, msg, "dial tcp "+target, "%s: the cause is readable", name)
			}
		}
	}
}

// A secret that the body snippet's cut would split is removed whole.
func TestHTTPErrorBodyRedactsAcrossTheCut(t *testing.T) {
	t.Parallel()
	srv, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, strings.Repeat("x", DefaultMaxErrorBody-3)+r.URL.Query().Get("token"))
	})
	h := newHTTP(t, srv.URL+"/hook?token=s3cret")
	err := h.Handle(context.Background(), nil, testEvent())
	var se *StatusError
	require.ErrorAs(t, err, &se)
	require.Len(t, se.Body, DefaultMaxErrorBody)
	require.NotContains(t, se.Body, "s3c")
}

// The header-value property: whatever bytes an event carries in the fields that become request
// headers (id, source, type, key, content type), Handle either delivers the request (and the
// ce-* attributes percent-decode to the original bytes) or fails permanently. Never an outage,
// never a hang.
func TestHTTPHeaderValuesProperty(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x6b6569726f))
	p := newHeaderProperty(t)
	outcomes := map[string]int{}
	for i := range 300 {
		ev := genEvent(rng)
		format := []string{FormatKeiro, FormatCloudEventsStructured, FormatCloudEventsBinary}[i%3]
		outcomes[format+" "+p.check(t, format, ev)]++
	}
	t.Logf("outcomes: %v", outcomes)
	require.Positive(t, outcomes[FormatCloudEventsBinary+" delivered"])
	require.Positive(t, outcomes[FormatKeiro+" permanent"])
}

// FuzzHTTPHeaderValues is TestHTTPHeaderValuesProperty with the fuzzer's bytes.
func FuzzHTTPHeaderValues(f *testing.F) {
	f.Add(uint8(0), "bad\nid-1", "ordering", "OrderPlaced", []byte{0xff, 0x00, 0x0a, 0x80}, true, "application/octet-stream")
	f.Add(uint8(2), "m", "Zürich", "T\x7f", []byte("k"), true, "text/plain; charset=\"utf\r\n8\"")
	f.Add(uint8(1), "%\"", " s ", "", []byte(nil), false, "application/json")
	p := newHeaderProperty(f)
	f.Fuzz(func(t *testing.T, format uint8, id, source, typ string, key []byte, hasKey bool, contentType string) {
		ev := testEvent()
		ev.MessageID, ev.Source, ev.EventType, ev.ContentType = id, source, typ, contentType
		ev.Key = nil
		if hasKey {
			k := string(key)
			ev.Key = &k
		}
		if !envelope.IsJSONContentType(contentType) {
			ev.Payload = key
		}
		p.check(t, []string{FormatKeiro, FormatCloudEventsStructured, FormatCloudEventsBinary}[format%3], ev)
	})
}

// headerProperty is a test server and one handler per format for the header-value property.
type headerProperty struct {
	handlers map[string]*HTTP
	seen     chan captured
}

func newHeaderProperty(t testing.TB) *headerProperty {
	p := &headerProperty{handlers: map[string]*HTTP{}, seen: make(chan captured, 1)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p.seen <- captured{header: r.Header.Clone(), body: b}
	}))
	srv.Config.ErrorLog = discardLog()
	srv.Start()
	t.Cleanup(srv.Close)
	for _, format := range []string{FormatKeiro, FormatCloudEventsStructured, FormatCloudEventsBinary} {
		h, err := NewHTTP(HTTPConfig{URL: srv.URL + "/events", Consumer: "billing", Format: format, Timeout: 10 * time.Second})
		require.NoError(t, err)
		t.Cleanup(h.CloseIdleConnections)
		p.handlers[format] = h
	}
	return p
}

// check runs ev through the handler of format and asserts the property; it returns
// "delivered" or "permanent".
func (p *headerProperty) check(t testing.TB, format string, ev envelope.Event) string {
	t.Helper()
	h := p.handlers[format]
	err := h.Handle(context.Background(), nil, ev)
	var got *captured
	select {
	case c := <-p.seen:
		got = &c
	default:
	}
	if err != nil {
		if !inbox.IsPermanent(err) || inbox.IsOutage(err) {
			t.Fatalf("%s: id %+q source %+q type %+q key %s content type %+q: an error that is not permanent: %v", format, ev.MessageID, ev.Source, ev.EventType, keyOf(ev), ev.ContentType, err)
		}
		return "permanent"
	}
	if got == nil {
		t.Fatalf("%s: id %+q: delivered, but the server saw nothing", format, ev.MessageID)
	}
	wantKey := strings.Trim(h.IdempotencyKey(context.Background(), ev), " \t")
	if k := got.header.Get(HeaderIdempotencyKey); k != wantKey {
		t.Fatalf("%s: Idempotency-Key %q, want %q", format, k, wantKey)
	}
	switch format {
	case FormatCloudEventsBinary:
		attrs := map[string]string{"Ce-Id": ev.MessageID, "Ce-Source": ev.Source, "Ce-Type": ev.EventType}
		if ev.Key != nil {
			attrs["Ce-Partitionkey"] = *ev.Key
		} else if v := got.header.Values("Ce-Partitionkey"); len(v) > 0 {
			t.Fatalf("ce-partitionkey %q without a key", v)
		}
		for name, want := range attrs {
			dec, derr := url.PathUnescape(got.header.Get(name))
			if derr != nil || dec != want {
				t.Fatalf("%s %q decodes to %q (%v), want %q", name, got.header.Get(name), dec, derr, want)
			}
		}
	default:
		var doc map[string]any
		if err := json.Unmarshal(got.body, &doc); err != nil {
			t.Fatalf("%s: body is not JSON: %v", format, err)
		}
		id := "message_id"
		if format == FormatCloudEventsStructured {
			id = "id"
		}
		if doc[id] != ev.MessageID {
			t.Fatalf("%s: %s %q, want %q", format, id, doc[id], ev.MessageID)
		}
		if format == FormatKeiro && ev.Key != nil {
			k, _ := doc["key"].(string)
			if doc["key_encoding"] == PayloadEncodingBase64 {
				raw, _ := base64.StdEncoding.DecodeString(k)
				k = string(raw)
			}
			if k != *ev.Key {
				t.Fatalf("key %q arrived as %q", *ev.Key, k)
			}
		}
	}
	return "delivered"
}

// keyOf quotes ev's key for a failure message.
func keyOf(ev envelope.Event) string {
	if ev.Key == nil {
		return "none"
	}
	return fmt.Sprintf("%+q", *ev.Key)
}

// genEvent generates an event whose header-bound fields are header-ish values.
func genEvent(r *rand.Rand) envelope.Event {
	ev := testEvent()
	ev.MessageID, ev.Source, ev.EventType = genValue(r), genValue(r), genValue(r)
	if r.IntN(4) == 0 {
		ev.Key = nil
	} else {
		k := genValue(r)
		ev.Key = &k
	}
	switch r.IntN(4) {
	case 0:
		ev.ContentType, ev.Payload = "application/json", []byte(`{"n":1}`)
	case 1:
		ev.ContentType, ev.Payload = "application/octet-stream", []byte(genValue(r))
	default:
		ev.ContentType, ev.Payload = genValue(r), []byte(genValue(r))
		if envelope.IsJSONContentType(ev.ContentType) {
			ev.Payload = []byte(`"x"`)
		}
	}
	return ev
}

// genValue returns a header-ish value: plain, empty, random bytes, control characters,
// non-UTF-8, non-ASCII UTF-8, percent signs and quotes, or long.
func genValue(r *rand.Rand) string {
	const printable = "abcXYZ019-._~:/?#[]@!$&'()*+,;= "
	pick := func(alphabet string, n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	switch r.IntN(10) {
	case 0:
		return ""
	case 1:
		b := make([]byte, r.IntN(24))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return string(b)
	case 2:
		return pick(printable+"\n\r\x00\x01\x1f\x7f\t", 1+r.IntN(20))
	case 3:
		return pick(printable, 3) + string([]byte{0xc3, 0x28, 0xff, 0xfe})[r.IntN(3):] // not UTF-8
	case 4:
		return []string{"Zürich", "注文", "☃ snow", "emoji 🚀"}[r.IntN(4)]
	case 5:
		return pick(`%"% %25%zz`, 1+r.IntN(12))
	case 6:
		v := pick(printable, 1000+r.IntN(20000))
		if r.IntN(20) == 0 {
			v = pick(printable, 1<<20+r.IntN(1000)) // beyond the server's header limit: 431
		}
		return v
	case 7:
		return " " + pick(printable, 5) + "\t"
	default:
		s := pick(printable, 1+r.IntN(30))
		if !utf8.ValidString(s) {
			panic("unreachable")
		}
		return s
	}
}

// discardLog silences a test server's log of the malformed requests it is sent on purpose.
func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }
