package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

func TestRelaySendSpansAndMetrics(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := newKafka(t)
	kc.CreateTopic(t, "orders", 1)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	st, err := outbox.NewStore(db.Schema, outbox.StoreOptions{MeterProvider: mp})
	require.NoError(t, err)
	ctx, business := tp.Tracer("test").Start(context.Background(), "place order")
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(ctx, tx, keyedEvents("orders", 3, 2)...)
		return err
	}))
	business.End()
	enqueue(t, db.Pool, st, keyedEvents("orders", 1, 1)...) // a duplicate of m-000000

	p := new(testenv.Progress)
	r, _ := startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), TracerProvider: tp, MeterProvider: mp, Logger: testLogger(t)})
	p.Wait(t, 3, 30*time.Second, nil)

	var sends []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == "send orders" {
			sends = append(sends, s)
		}
	}
	require.Len(t, sends, 3)
	recs := kc.ConsumeRecords(t, 3, 30*time.Second, "orders")
	require.Len(t, recs, 3)
	byID := map[string]string{}
	for _, rec := range recs {
		var id, tpHeader string
		for _, h := range rec.Headers {
			switch h.Key {
			case "keiro-message-id":
				id = string(h.Value)
			case "traceparent":
				tpHeader = string(h.Value)
			}
		}
		byID[id] = tpHeader
	}
	for _, s := range sends {
		require.Equal(t, trace.SpanKindProducer, s.SpanKind())
		require.Equal(t, business.SpanContext().TraceID(), s.SpanContext().TraceID(), "continues the business trace")
		require.Equal(t, business.SpanContext().SpanID(), s.Parent().SpanID())
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value
		}
		require.Equal(t, "kafka", attrs["messaging.system"].AsString())
		require.Equal(t, "send", attrs["messaging.operation.type"].AsString())
		require.Equal(t, "send", attrs["messaging.operation.name"].AsString())
		require.Equal(t, "orders", attrs["messaging.destination.name"].AsString())
		require.Equal(t, "0", attrs["messaging.destination.partition.id"].AsString())
		require.Contains(t, attrs, attribute.Key("messaging.kafka.offset"))
		require.Contains(t, attrs, attribute.Key("messaging.kafka.message.key"))
		require.Equal(t, int64(1), attrs["keiro.outbox.attempt"].AsInt64())
		id := attrs["messaging.message.id"].AsString()
		want := fmt.Sprintf("00-%s-%s-01", s.SpanContext().TraceID(), s.SpanContext().SpanID())
		require.Equal(t, want, byID[id], "the record carries the send span's context")
	}

	// The running relay's own maintenance pass may hold the maintenance lock (Ran = false):
	// take our turn once it is done.
	require.Eventually(t, func() bool {
		res, err := r.MaintenancePass(context.Background())
		require.NoError(t, err)
		return res.Ran
	}, 30*time.Second, time.Millisecond)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, "keiro", sm.Scope.Name)
		for _, m := range sm.Metrics {
			got[m.Name] = m.Data
		}
	}
	sum := func(name string, attrs ...attribute.KeyValue) int64 {
		var n int64
		want := attribute.NewSet(attrs...)
		for _, dp := range got[name].(metricdata.Sum[int64]).DataPoints {
			if dp.Attributes.Equals(&want) {
				n += dp.Value
			}
		}
		return n
	}
	require.Equal(t, int64(3), sum("keiro.outbox.enqueued", attribute.String("outcome", "inserted"), attribute.String("source", "ordering")))
	require.Equal(t, int64(1), sum("keiro.outbox.enqueued", attribute.String("outcome", "duplicate"), attribute.String("source", "ordering")))
	require.Equal(t, int64(3), sum("keiro.outbox.published", attribute.String("messaging.destination.name", "orders")))
	lat := got["keiro.outbox.publish.latency"].(metricdata.Histogram[float64])
	require.Equal(t, uint64(3), lat.DataPoints[0].Count)
	// The gauges are per destination and exist once a pass saw a row of it
	// (TestRelayGaugesPerDestinationAndSendMetrics); whatever was sampled is drained now.
	if backlog, ok := got["keiro.outbox.backlog"].(metricdata.Gauge[int64]); ok {
		for _, dp := range backlog.DataPoints {
			require.Equal(t, int64(0), dp.Value, "per destination")
		}
	}
	require.Contains(t, got, "keiro.outbox.batch.size")
}
