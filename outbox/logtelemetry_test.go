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

	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
	"github.com/keiro-go/keiro/tracing"
)

// A log-mode relay feeds the claim relay's instruments and starts the same send span per
// record, a child of the row's traceparent, whose context the record carries.
func TestLogModeSendSpansAndMetrics(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	ctx := context.Background()
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	_, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeLog, "") // creates the slot: it holds what follows
	require.NoError(t, err)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	bctx, business := tp.Tracer("test").Start(ctx, "place order")
	require.NoError(t, pgx.BeginFunc(bctx, db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(bctx, tx, keyedEvents("orders", 3, 2)...)
		return err
	}))
	business.End()
	require.Equal(t, 3, count(t, db.Pool, "keiro_outbox_log"))

	r, _ := startRelay(t, db, kc, outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine, TracerProvider: tp, MeterProvider: mp, Logger: testLogger(t)})
	recs := kc.ConsumeRecords(t, 3, time.Minute, "orders")
	require.Len(t, recs, 3)
	sends := func() []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, s := range sr.Ended() {
			if s.Name() == "send orders" {
				out = append(out, s)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(sends()) == 3 && r.Stats().Published == 3 }, time.Minute, 10*time.Millisecond)
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
	for _, s := range sends() {
		require.Equal(t, trace.SpanKindProducer, s.SpanKind())
		require.Equal(t, business.SpanContext().TraceID(), s.SpanContext().TraceID(), "continues the business trace")
		require.Equal(t, business.SpanContext().SpanID(), s.Parent().SpanID(), "a child of the row's traceparent")
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value
		}
		require.Equal(t, "kafka", attrs["messaging.system"].AsString())
		require.Equal(t, "send", attrs["messaging.operation.type"].AsString())
		require.Equal(t, "orders", attrs["messaging.destination.name"].AsString())
		require.Equal(t, "0", attrs["messaging.destination.partition.id"].AsString())
		require.Contains(t, attrs, attribute.Key("messaging.kafka.offset"))
		require.Contains(t, attrs, attribute.Key("messaging.kafka.message.key"))
		id := attrs["messaging.message.id"].AsString()
		want := fmt.Sprintf("00-%s-%s-01", s.SpanContext().TraceID(), s.SpanContext().SpanID())
		require.Equal(t, want, byID[id], "the record carries the send span's context")
	}

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
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
	require.Equal(t, int64(3), sum(tracing.MetricOutboxPublished, attribute.String("messaging.destination.name", "orders")))
	require.Equal(t, uint64(3), got[tracing.MetricOutboxPublishLatency].(metricdata.Histogram[float64]).DataPoints[0].Count)
	require.Equal(t, int64(3), sum(tracing.MetricClientSentMessages, attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.operation.name", "send"), attribute.String("messaging.destination.name", "orders")))
	require.Contains(t, got, tracing.MetricClientOperationDuration)
}
