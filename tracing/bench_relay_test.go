package tracing_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/testdb"
	"github.com/keiro-go/keiro/internal/testkafka"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/tracing"
)

// drainRowsPerOp is how many rows one benchmark operation enqueues (in one transaction) and
// waits for the relay to publish.
const drainRowsPerOp = 1000

// BenchmarkRelayDrainInstrumentation is the relay's drain rate under three telemetry setups,
// side by side in one run:
//
//   - uninstrumented: the otel API's no-op MeterProvider and TracerProvider — the limit, "no
//     instrumentation at all";
//   - no-exporter: the providers tracing.Setup installs with no OTEL_* variable set, which is
//     what cmd/relay runs by default (SDK metrics behind the Prometheus exporter, no tracer
//     provider). The budget: within 5% of uninstrumented;
//   - traced: no-exporter plus an SDK tracer sampling every send span into a batch processor
//     whose exporter discards them (tracing's own cost, no network).
//
// Each operation commits drainRowsPerOp rows over 50 keys in one transaction (untimed up to the
// commit) and waits until the relay reports them published; msgs/s is the figure to compare.
func BenchmarkRelayDrainInstrumentation(b *testing.B) {
	setupProviders := func(b *testing.B) (metric.MeterProvider, trace.TracerProvider) {
		tel, err := tracing.Setup(context.Background(), tracing.Options{NoGlobals: true, Getenv: func(string) string { return "" }})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
		return tel.MeterProvider(), tel.TracerProvider()
	}
	variants := []struct {
		name      string
		providers func(b *testing.B) (metric.MeterProvider, trace.TracerProvider)
	}{
		{"uninstrumented", func(*testing.B) (metric.MeterProvider, trace.TracerProvider) {
			return metricnoop.NewMeterProvider(), tracenoop.NewTracerProvider()
		}},
		{"no-exporter", setupProviders},
		{"traced", func(b *testing.B) (metric.MeterProvider, trace.TracerProvider) {
			mp, _ := setupProviders(b)
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			return mp, tp
		}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			mp, tp := v.providers(b)
			benchDrain(b, mp, tp)
		})
	}
}

func benchDrain(b *testing.B, mp metric.MeterProvider, tp trace.TracerProvider) {
	ctx := context.Background()
	db := testdb.New(b)
	kc := testkafka.New(b)
	const topic = "bench.orders.v1"
	kc.CreateTopic(b, topic, 8)
	store, err := outbox.NewStore(db.Schema)
	if err != nil {
		b.Fatal(err)
	}
	published := make(chan int, 1024)
	relay, err := outbox.NewRelay(db.Pool, kc.Client(b, outbox.ProducerOpts()...), outbox.RelayConfig{
		Schema: db.Schema, MeterProvider: mp, TracerProvider: tp, Logger: slog.New(slog.DiscardHandler),
		PollInterval: 10 * time.Millisecond, MaintenanceInterval: time.Hour,
		OnBatch: func(r outbox.BatchResult) { published <- r.Published },
	})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()

	keys := make([]string, 50)
	for i := range keys {
		keys[i] = fmt.Sprintf("customer-%d", i)
	}
	events := make([]envelope.Event, drainRowsPerOp)
	seq := 0
	// A traced business context, so rows carry a stored traceparent as in production.
	bctx, span := sdktrace.NewTracerProvider().Tracer("bench").Start(ctx, "POST /orders")
	defer span.End()

	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for i := range events {
			seq++
			events[i] = envelope.Event{
				MessageID: fmt.Sprintf("m-%09d", seq), Source: "ordering", Destination: topic, Key: &keys[seq%len(keys)],
				EventType: "OrderPlaced", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
				Payload: []byte(`{"order":1}`), OccurredAt: time.Now().UTC(),
			}
		}
		// The rows become visible to the relay at commit: time from there to the last ack mark.
		if err := pgx.BeginFunc(bctx, db.Pool, func(tx pgx.Tx) error {
			_, err := store.EnqueueTx(bctx, tx, events...)
			if err == nil {
				b.StartTimer()
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
		for n := 0; n < drainRowsPerOp; {
			select {
			case p := <-published:
				n += p
			case <-time.After(60 * time.Second):
				b.Fatalf("relay published %d of %d rows", n, drainRowsPerOp)
			}
		}
	}
	b.ReportMetric(float64(b.N*drainRowsPerOp)/b.Elapsed().Seconds(), "msgs/s")
}
