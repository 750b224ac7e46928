package publish_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/publish"
	"github.com/keiro-go/keiro/tracing"
)

// newClient returns a client that never connects (no record is produced).
func newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	c, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// A client without the relay's producer options is refused, every problem at once.
func TestCheckClientReportsEveryProblem(t *testing.T) {
	_, err := publish.CheckClient(nil, 1, 0)
	require.ErrorContains(t, err, "client is nil")
	c := newClient(t, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite(),
		kgo.MaxBufferedRecords(10), kgo.MaxBufferedBytes(1<<20))
	_, err = publish.CheckClient(c, 100, 0)
	for _, want := range []string{"RequiredAcks must be AllISRAcks", "idempotent writes are disabled",
		"ManualFlushing is required", "MaxBufferedRecords (10) must be at least", "MaxBufferedBytes (1048576) must not be set"} {
		require.ErrorContains(t, err, want)
	}
}

// The largest record is the configured one, lowered to the client's ProducerBatchMaxBytes,
// and franz-go's default when neither is set.
func TestCheckClientMaxRecord(t *testing.T) {
	opts := []kgo.Opt{kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing()}
	max, err := publish.CheckClient(newClient(t, opts...), 1, 0)
	require.NoError(t, err)
	require.Equal(t, publish.DefaultMaxRecordBytes, max)
	max, err = publish.CheckClient(newClient(t, append(opts, kgo.ProducerBatchMaxBytes(4096))...), 1, 8192)
	require.NoError(t, err)
	require.Equal(t, 4096, max)
}

// A record over MaxRecordBytes is refused with its size; the headers are keiro's, with
// CloudEvents' for the configured destinations only.
func TestRecordAndSize(t *testing.T) {
	c := newClient(t, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing())
	p, err := publish.New(publish.Config{Client: c, MaxRecordBytes: 600, CloudEventsDestinations: []string{"ce"}})
	require.NoError(t, err)
	ev := envelope.Event{MessageID: "m1", Source: "s", EventType: "t", Destination: "orders", Payload: []byte(`{}`)}
	var rec kgo.Record
	headers := p.Record(&rec, &ev, nil)
	require.Equal(t, "orders", rec.Topic)
	require.Len(t, rec.Headers, len(headers))
	plain := len(rec.Headers)
	ev.Destination = "ce"
	p.Record(&rec, &ev, headers)
	require.Greater(t, len(rec.Headers), plain)
	size, err := p.CheckSize(&rec)
	require.Equal(t, publish.RecordSize(&rec), size)
	if size > 600 {
		require.ErrorContains(t, err, "exceeds the 600-byte limit")
	} else {
		require.NoError(t, err)
	}
	rec.Value = make([]byte, 1000)
	_, err = p.CheckSize(&rec)
	require.ErrorContains(t, err, "exceeds the 600-byte limit")
}

// A suspect is seen until it is taken or removed.
func TestSuspects(t *testing.T) {
	var s publish.Suspects[string]
	require.False(t, s.Has("a"))
	s.Add("a")
	require.True(t, s.Has("a"))
	require.True(t, s.Take("a"))
	require.False(t, s.Take("a"))
	s.Add("b")
	s.Remove("b")
	require.False(t, s.Has("b"))
}

// attrSampler samples every span and keeps the attributes each was started with.
type attrSampler struct{ started [][]attribute.KeyValue }

func (s *attrSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	s.started = append(s.started, p.Attributes)
	return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample}
}

func (s *attrSampler) Description() string { return "attrSampler" }

// A recorded send span carries the messaging attributes: those of its destination from its
// start (a sampler sees them), the record's own (message id, key) once recorded; its trace
// context goes into the record's headers.
func TestStartSendRecordedSpan(t *testing.T) {
	sampler := &attrSampler{}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(rec))
	c := newClient(t, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing())
	p, err := publish.New(publish.Config{Client: c, Tracer: tp.Tracer("test")})
	require.NoError(t, err)
	key := "k1"
	for _, dest := range []string{"orders", "orders", "payments"} {
		ev := envelope.Event{MessageID: "m-" + dest, Source: "s", EventType: "t", Destination: dest, Key: &key, Payload: []byte(`{}`)}
		send, tc := p.StartSend(&ev, attribute.Int("keiro.outbox.attempt", 2))
		require.NotNil(t, tc, "a recorded span's trace context goes into the headers")
		send.Done(&kgo.Record{Topic: dest, Partition: 3, Offset: 7}, nil, time.Now())
	}
	spans := rec.Ended()
	require.Len(t, spans, 3)
	for i, dest := range []string{"orders", "orders", "payments"} {
		s := spans[i]
		require.Equal(t, "send "+dest, s.Name())
		require.Equal(t, trace.SpanKindProducer, s.SpanKind())
		attrs := attribute.NewSet(s.Attributes()...)
		for k, want := range map[attribute.Key]string{"messaging.system": "kafka", "messaging.operation.type": "send",
			"messaging.destination.name": dest, "messaging.message.id": "m-" + dest, "messaging.kafka.message.key": "k1",
			"messaging.destination.partition.id": "3"} {
			v, ok := attrs.Value(k)
			require.True(t, ok, "span %d has no %s", i, k)
			require.Equal(t, want, v.AsString(), "span %d: %s", i, k)
		}
		v, ok := attrs.Value("keiro.outbox.attempt")
		require.True(t, ok)
		require.Equal(t, int64(2), v.AsInt64())
		started := attribute.NewSet(sampler.started[i]...)
		v, ok = started.Value("messaging.destination.name")
		require.True(t, ok, "the sampler sees the destination")
		require.Equal(t, dest, v.AsString())
	}
}

// With a no-op tracer (no trace exporter) a send records no span, its record carries the row's
// own trace context, and the send itself allocates once.
func TestStartSendNoopTracer(t *testing.T) {
	c := newClient(t, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing())
	p, err := publish.New(publish.Config{Client: c, Meter: metricnoop.NewMeterProvider().Meter("")})
	require.NoError(t, err)
	key := "k1"
	ev := envelope.Event{MessageID: "m1", Source: "s", EventType: "t", Destination: "orders", Key: &key, Payload: []byte(`{}`),
		TraceContext: &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	rec := &kgo.Record{Topic: "orders"}
	allocs := testing.AllocsPerRun(100, func() {
		send, tc := p.StartSend(&ev)
		require.Nil(t, tc)
		send.Done(rec, nil, time.Now())
	})
	require.LessOrEqual(t, allocs, 1.0)
}

// The send metrics carry the semantic conventions' attributes: the destination on every send,
// and error.type (the Kafka error's name) on a failed one, counted apart from the successes.
func TestSendMetricsAttributes(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	c := newClient(t, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing())
	p, err := publish.New(publish.Config{Client: c, Meter: mp.Meter("test")})
	require.NoError(t, err)
	ev := envelope.Event{MessageID: "m1", Source: "s", EventType: "t", Destination: "orders", Payload: []byte(`{}`)}
	for _, err := range []error{nil, nil, kerr.NotEnoughReplicas} {
		send, _ := p.StartSend(&ev)
		send.Done(&kgo.Record{Topic: "orders"}, err, time.Now())
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	counts := map[string]int64{} // error.type ("" for none) → sends
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != tracing.MetricClientSentMessages {
				continue
			}
			found = true
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				for k, want := range map[attribute.Key]string{"messaging.system": "kafka",
					"messaging.operation.name": "send", "messaging.destination.name": "orders"} {
					v, ok := dp.Attributes.Value(k)
					require.True(t, ok, "no %s", k)
					require.Equal(t, want, v.AsString())
				}
				et, _ := dp.Attributes.Value("error.type")
				counts[et.AsString()] += dp.Value
			}
		}
	}
	require.True(t, found, "no %s", tracing.MetricClientSentMessages)
	require.Equal(t, map[string]int64{"": 2, "NOT_ENOUGH_REPLICAS": 1}, counts)
}
