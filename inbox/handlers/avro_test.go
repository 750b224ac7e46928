package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/schema"
)

const orderSchema = `{"type":"record","name":"Order","namespace":"billing","fields":[
  {"name":"id","type":"string"},{"name":"amount","type":"long"}]}`

func TestAvroDecoderRendersJSON(t *testing.T) {
	t.Parallel()
	registry := testenv.NewSchemaRegistry(t) // the real registry (Apicurio)
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: registry.URL, MaxAttempts: 1, RequestTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(reg.Close)
	ctx := context.Background()
	ev := testEvent()
	ev.Destination = registry.Name(ev.Destination)
	_, err = reg.RegisterSchema(ctx, ev.Destination+"-value", orderSchema)
	require.NoError(t, err)
	ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{})
	require.NoError(t, err)
	des, err := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	require.NoError(t, err)
	decode := AvroDecoder(des)

	require.NoError(t, ser.Encode(ctx, &ev, map[string]any{"id": "o-1", "amount": int64(42)}))
	require.True(t, schema.IsAvroContentType(ev.ContentType), ev.ContentType)

	doc, err := NewDocument(ctx, ev, decode)
	require.NoError(t, err)
	require.Empty(t, doc.PayloadEncoding)
	var payload map[string]any
	require.NoError(t, json.Unmarshal(doc.Payload, &payload))
	require.Equal(t, map[string]any{"id": "o-1", "amount": float64(42)}, payload)

	// Bytes that are not a Confluent frame can never decode: permanent.
	bad := ev
	bad.Payload = []byte{9, 9, 9}
	_, err = NewDocument(ctx, bad, decode)
	require.Error(t, err)
	require.True(t, inbox.IsPermanent(err), "%v", err)

	// JSON and other content types are not the decoder's business.
	js, err := decode(ctx, testEvent())
	require.NoError(t, err)
	require.Nil(t, js)
}

func TestAvroDecoderRegistryDownIsRetryable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: srv.URL, MaxAttempts: 1, RequestTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(reg.Close)
	des, err := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	require.NoError(t, err)
	ev := testEvent()
	ev.ContentType = "application/vnd.confluent.avro"
	ev.Payload = schema.AppendFrameHeader(nil, 77)
	ev.Payload = append(ev.Payload, 2, 'x')
	_, err = AvroDecoder(des)(context.Background(), ev)
	require.Error(t, err)
	require.False(t, inbox.IsPermanent(err), "%v", err)
}

// An unreachable registry is an outage for every message, not a failure of this one: no
// attempt is used, so good messages are not dead-lettered while it is down. The consumer
// stopping (its context cancelled) is neither permanent nor an outage.
func TestAvroDecoderRegistryDownIsAnOutage(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: srv.URL, MaxAttempts: 1, RequestTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(reg.Close)
	des, err := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	require.NoError(t, err)
	ev := testEvent()
	ev.ContentType = "application/vnd.confluent.avro"
	ev.Payload = append(schema.AppendFrameHeader(nil, 77), 2, 'x')
	_, err = AvroDecoder(des)(context.Background(), ev)
	require.True(t, inbox.IsOutage(err), "%v", err)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = AvroDecoder(des)(ctx, ev)
	require.Error(t, err)
	require.False(t, inbox.IsPermanent(err), "a stopping consumer does not poison the message: %v", err)
}
