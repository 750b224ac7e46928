package handlers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
)

// The http target receives a proper CloudEvent in structured mode: the attributes and the data
// in one application/cloudevents+json object.
func TestHTTPCloudEventsStructured(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Format = FormatCloudEventsStructured })
	require.NoError(t, h.Handle(context.Background(), nil, testEvent()))
	got := <-seen
	require.Equal(t, ContentTypeCloudEventsJSON, got.header.Get("Content-Type"))
	require.Equal(t, "billing:ordering:msg-1", got.header.Get(HeaderIdempotencyKey))
	var ce map[string]any
	require.NoError(t, json.Unmarshal(got.body, &ce), string(got.body))
	require.Equal(t, "1.0", ce["specversion"])
	require.Equal(t, "msg-1", ce["id"])
	require.Equal(t, "ordering", ce["source"])
	require.Equal(t, "OrderPlaced", ce["type"])
	require.Equal(t, "2026-11-29T07:00:00Z", ce["time"])
	require.Equal(t, "order-7", ce["partitionkey"])
	require.Equal(t, envelope.ContentTypeJSON, ce["datacontenttype"])
	require.Equal(t, map[string]any{"amount": float64(42)}, ce["data"])

	// A binary payload travels as data_base64 with its own content type.
	ev := testEvent()
	ev.ContentType, ev.Payload = "application/octet-stream", []byte{0, 1, 2, 0xff}
	require.NoError(t, h.Handle(context.Background(), nil, ev))
	got = <-seen
	ce = nil
	require.NoError(t, json.Unmarshal(got.body, &ce))
	require.Equal(t, "application/octet-stream", ce["datacontenttype"])
	require.Equal(t, base64.StdEncoding.EncodeToString(ev.Payload), ce["data_base64"])
	require.NotContains(t, ce, "data")
}

// In binary mode the attributes are ce-* headers and the body is the data itself.
func TestHTTPCloudEventsBinary(t *testing.T) {
	t.Parallel()
	srv, seen := newServer(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Format = FormatCloudEventsBinary })
	require.NoError(t, h.Handle(context.Background(), nil, testEvent()))
	got := <-seen
	for k, v := range map[string]string{
		"Ce-Specversion": "1.0", "Ce-Id": "msg-1", "Ce-Source": "ordering", "Ce-Type": "OrderPlaced",
		"Ce-Time": "2026-11-29T07:00:00Z", "Ce-Partitionkey": "order-7", "Content-Type": envelope.ContentTypeJSON,
	} {
		require.Equal(t, v, got.header.Get(k), k)
	}
	require.JSONEq(t, `{"amount": 42}`, string(got.body))

	ev := testEvent()
	ev.ContentType, ev.Payload = "application/octet-stream", []byte{0, 1, 2, 0xff}
	require.NoError(t, h.Handle(context.Background(), nil, ev))
	got = <-seen
	require.Equal(t, "application/octet-stream", got.header.Get("Content-Type"))
	require.Equal(t, ev.Payload, got.body, "the payload's own bytes")

	_, err := NewHTTP(HTTPConfig{URL: srv.URL, Consumer: "c", Format: "protobuf"})
	require.ErrorContains(t, err, `Format "protobuf" is not keiro, cloudevents-structured or cloudevents-binary`)
}
