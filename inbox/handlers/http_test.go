package handlers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// captured is one request the test server saw.
type captured struct {
	header http.Header
	body   []byte
}

// newServer answers every request with respond and reports the requests it saw on the channel.
func newServer(t *testing.T, respond func(w http.ResponseWriter, r *http.Request)) (*httptest.Server, chan captured) {
	t.Helper()
	seen := make(chan captured, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen <- captured{header: r.Header.Clone(), body: b}
		respond(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, seen
}

func testEvent() envelope.Event {
	key := "order-7"
	cause := envelope.NewUUIDv7()
	return envelope.Event{
		MessageID:     "msg-1",
		Source:        "ordering",
		Destination:   "billing.orders.v1",
		Key:           &key,
		EventType:     "OrderPlaced",
		SchemaVersion: 2,
		ContentType:   "application/json; charset=utf-8",
		Payload:       []byte(`{"amount": 42}`),
		OccurredAt:    time.Date(2026, 11, 29, 7, 0, 0, 0, time.UTC),
		CausationID:   &cause,
		Attributes:    json.RawMessage(`{"tenant":"t1"}`),
	}
}

func newHTTP(t *testing.T, url string, mod ...func(*HTTPConfig)) *HTTP {
	t.Helper()
	cfg := HTTPConfig{URL: url, Consumer: "billing"}
	for _, m := range mod {
		m(&cfg)
	}
	h, err := NewHTTP(cfg)
	require.NoError(t, err)
	t.Cleanup(h.CloseIdleConnections)
	return h
}

func TestHTTPDeliversDocumentWithHeaders(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) {
		c.Header = http.Header{"Authorization": {"Bearer s3cret"}, "Idempotency-Key": {"overridden?"}}
	})

	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, _ := trace.ParseTraceState("vendor=abc")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, TraceState: ts})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	ev := testEvent()
	require.NoError(t, h.Handle(ctx, nil, ev))
	got := <-seen

	require.Equal(t, "billing:ordering:msg-1", got.header.Get(HeaderIdempotencyKey))
	require.Equal(t, []string{"billing:ordering:msg-1"}, got.header.Values(HeaderIdempotencyKey))
	require.Equal(t, "application/json", got.header.Get("Content-Type"))
	require.Equal(t, "Bearer s3cret", got.header.Get("Authorization"))
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", got.header.Get("traceparent"))
	require.Equal(t, "vendor=abc", got.header.Get("tracestate"))

	var doc map[string]any
	require.NoError(t, json.Unmarshal(got.body, &doc))
	require.Equal(t, "msg-1", doc["message_id"])
	require.Equal(t, "ordering", doc["source"])
	require.Equal(t, "billing.orders.v1", doc["destination"])
	require.Equal(t, "order-7", doc["key"])
	require.Equal(t, "OrderPlaced", doc["event_type"])
	require.EqualValues(t, 2, doc["schema_version"])
	require.Equal(t, "application/json; charset=utf-8", doc["content_type"])
	require.Equal(t, "2026-11-29T07:00:00Z", doc["occurred_at"])
	require.Equal(t, ev.CausationID.String(), doc["causation_id"])
	require.Nil(t, doc["correlation_id"])
	require.Nil(t, doc["source_event_id"])
	require.Equal(t, map[string]any{"tenant": "t1"}, doc["attributes"])
	require.Equal(t, map[string]any{"amount": float64(42)}, doc["payload"], "JSON payload is embedded, not encoded")
	require.NotContains(t, doc, "payload_encoding")
}

func TestHTTPWithoutSpanSendsNoTraceparent(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Header = http.Header{"Traceparent": {"00-stale"}} })
	require.NoError(t, h.Handle(context.Background(), nil, testEvent()))
	got := <-seen
	require.Empty(t, got.header.Values("traceparent"), "a configured header must not forge the trace context")
}

func TestHTTPBinaryPayloadIsBase64(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) {
		c.DedupeKey = func(_ context.Context, ev envelope.Event) string { return "custom-" + ev.MessageID }
	})
	ev := testEvent()
	ev.ContentType = "application/vnd.apache.avro+binary"
	ev.Payload = []byte{0, 0, 0, 0, 1, 0xff, 0x10}
	ev.Key = nil
	ev.Attributes = nil
	require.NoError(t, h.Handle(context.Background(), nil, ev))
	got := <-seen
	require.Equal(t, "billing:ordering:custom-msg-1", got.header.Get(HeaderIdempotencyKey))
	var doc map[string]any
	require.NoError(t, json.Unmarshal(got.body, &doc))
	require.Equal(t, "base64", doc["payload_encoding"])
	raw, err := base64.StdEncoding.DecodeString(doc["payload"].(string))
	require.NoError(t, err)
	require.Equal(t, ev.Payload, raw)
	require.Nil(t, doc["key"])
	require.Nil(t, doc["attributes"])
}

func TestHTTPPayloadDecoderHook(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
	var calls int
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) {
		c.DecodePayload = func(_ context.Context, ev envelope.Event) (json.RawMessage, error) {
			calls++
			if ev.ContentType != "application/avro" {
				return nil, nil
			}
			return json.RawMessage(`{"decoded":true}`), nil
		}
	})
	ev := testEvent()
	ev.ContentType = "application/avro"
	ev.Payload = []byte{0, 1, 2}
	require.NoError(t, h.Handle(context.Background(), nil, ev))
	var doc map[string]any
	require.NoError(t, json.Unmarshal((<-seen).body, &doc))
	require.Equal(t, map[string]any{"decoded": true}, doc["payload"])
	require.NotContains(t, doc, "payload_encoding")

	ev.ContentType = "text/plain"
	require.NoError(t, h.Handle(context.Background(), nil, ev))
	require.NoError(t, json.Unmarshal((<-seen).body, &doc))
	require.Equal(t, "base64", doc["payload_encoding"])
	require.Equal(t, 2, calls)
}

func TestHTTPDecoderErrorKeepsItsClass(t *testing.T) {
	t.Parallel()
	srv, _ := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
	transient := errors.New("registry unreachable")
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) {
		c.DecodePayload = func(context.Context, envelope.Event) (json.RawMessage, error) { return nil, transient }
	})
	ev := testEvent()
	ev.ContentType = "application/avro"
	err := h.Handle(context.Background(), nil, ev)
	require.ErrorIs(t, err, transient)
	require.False(t, inbox.IsPermanent(err))
}

func TestHTTPStatusClassification(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status     int
		retryAfter string
		permanent  bool
		outage     bool
		wantDelay  time.Duration
	}{
		{status: 400, permanent: true},
		{status: 401, permanent: true},
		{status: 404, permanent: true},
		{status: 409, permanent: true},
		{status: 422, permanent: true},
		{status: 302, permanent: true},
		{status: 408},
		{status: 429, retryAfter: "7", outage: true, wantDelay: 7 * time.Second},
		{status: 500},
		{status: 502, outage: true},
		{status: 503, retryAfter: "120", outage: true, wantDelay: 2 * time.Minute},
		{status: 504, retryAfter: "soon", outage: true},
	}
	for _, tc := range cases {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			t.Parallel()
			long := strings.Repeat("x", 4000)
			srv, _ := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				if tc.status == 302 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, "reason:"+long)
			})
			h := newHTTP(t, srv.URL)
			err := h.Handle(context.Background(), nil, testEvent())
			require.Error(t, err)
			require.Equal(t, tc.permanent, inbox.IsPermanent(err), "permanent classification of %d: %v", tc.status, err)
			require.Equal(t, tc.outage, inbox.IsOutage(err), "outage classification of %d: %v", tc.status, err)
			var oe *inbox.OutageError
			if errors.As(err, &oe) {
				require.Equal(t, tc.wantDelay, oe.RetryAfter, "the outage carries Retry-After")
			}
			var se *StatusError
			require.ErrorAs(t, err, &se)
			require.Equal(t, tc.status, se.StatusCode)
			require.Len(t, se.Body, DefaultMaxErrorBody, "the body snippet is bounded")
			require.True(t, strings.HasPrefix(se.Body, "reason:"))
			require.Contains(t, err.Error(), "msg-1")
			d, ok := RetryAfter(err)
			require.Equal(t, tc.wantDelay, d)
			require.Equal(t, tc.wantDelay > 0, ok)
		})
	}
}

func TestHTTPTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Timeout = 50 * time.Millisecond })
	err := h.Handle(context.Background(), nil, testEvent())
	require.Error(t, err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, inbox.IsPermanent(err))
	require.True(t, inbox.IsOutage(err), "%v", err)
}

func TestHTTPConnectionRefusedIsRetryable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	h := newHTTP(t, "http://"+addr+"/events")
	err = h.Handle(context.Background(), nil, testEvent())
	require.Error(t, err)
	require.False(t, inbox.IsPermanent(err))
	require.True(t, inbox.IsOutage(err), "%v", err)
	var se *StatusError
	require.False(t, errors.As(err, &se))
}

func TestHTTPInvalidJSONPayloadIsPermanent(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) {})
	h := newHTTP(t, srv.URL)
	ev := testEvent()
	ev.Payload = []byte(`{"amount": `)
	err := h.Handle(context.Background(), nil, ev)
	require.ErrorIs(t, err, ErrInvalidJSONPayload)
	require.True(t, inbox.IsPermanent(err))
	require.Empty(t, seen, "nothing is sent for a malformed payload")
}

func TestHTTPConfigValidationReportsAllProblems(t *testing.T) {
	t.Parallel()
	_, err := NewHTTP(HTTPConfig{URL: "ftp://user:pw@host/x", Timeout: -time.Second, MaxErrorBody: -1})
	require.Error(t, err)
	for _, want := range []string{"URL must be an absolute", "Consumer is required", "Timeout must not be negative", "MaxErrorBody"} {
		require.Contains(t, err.Error(), want)
	}
	require.NotContains(t, err.Error(), "pw")

	_, err = NewHTTP(HTTPConfig{})
	require.ErrorContains(t, err, "URL is required")
	_, err = NewHTTP(HTTPConfig{URL: "http://[::1", Consumer: "c"})
	require.ErrorContains(t, err, "not a valid URL")
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	require.Equal(t, 30*time.Second, parseRetryAfter("30", now))
	require.Equal(t, 90*time.Second, parseRetryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now))
	require.Zero(t, parseRetryAfter(now.Add(-time.Minute).Format(http.TimeFormat), now))
	require.Zero(t, parseRetryAfter("-5", now))
	require.Zero(t, parseRetryAfter("", now))
	require.Equal(t, 24*time.Hour, parseRetryAfter("99999999", now))
}
