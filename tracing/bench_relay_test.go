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
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/tracing/otelsetup"
)

// drainRowsPerOp is how many rows one benchmark operation enqueues (in one transaction) and
// waits for the relay to publish.
const drainRowsPerOp = 1000

// BenchmarkRelayDrainInstrumentation is the relay's drain rate under three telemetry setups:
//
//   - uninstrumented: the otel API's no-op MeterProvider and TracerProvider — the limit, "no
//     instrumentation at all";
//   - no-exporter: the providers otelsetup.Setup installs with no OTEL_* variable set, which is
//     what cmd/relay runs by default (SDK metrics behind the Prometheus exporter, no tracer
//     provider). The budget: within 5% of uninstrumented;
//   - traced: no-exporter plus an SDK tracer sampling every send span into a batch processor
//     whose exporter discards them (tracing's own cost, no network).
//
// The three relays (each with its own schema and kfake cluster) run side by side and every
// operation drains one round on each, in rotating order, so load from elsewhere on a shared
// machine hits all three alike. A round commits drainRowsPerOp rows over 50 keys in one
// transaction (timed from its COMMIT) and waits until the relay reports them published.
// Reported: msgs/s per setup and the overhead of no-exporter over uninstrumented in percent.
func BenchmarkRelayDrainInstrumentation(b *testing.B) {
	setupProviders := func(b *testing.B) (metric.MeterProvider, trace.TracerProvider) {
		tel, err := otelsetup.Setup(context.Background(), otelsetup.Options{NoGlobals: true, Getenv: func(string) string { return "" }})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
		return tel.MeterProvider(), tel.TracerProvider()
	}
	noop := func(*testing.B) (metric.MeterProvider, trace.TracerProvider) {
		return metricnoop.NewMeterProvider(), tracenoop.NewTracerProvider()
	}
	traced := func(b *testing.B) (metric.MeterProvider, trace.TracerProvider) {
		mp, _ := setupProviders(b)
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return mp, tp
	}
	names := []string{"uninstrumented", "no-exporter", "traced"}
	rigs := []*drainRig{newDrainRig(b, noop), newDrainRig(b, setupProviders), newDrainRig(b, traced)}
	elapsed := make([]time.Duration, len(rigs))

	b.ResetTimer()
	for i := range b.N {
		for j := range rigs {
			k := (i + j) % len(rigs)
			elapsed[k] += rigs[k].round(b)
		}
	}
	b.StopTimer()
	rate := func(k int) float64 { return float64(b.N*drainRowsPerOp) / elapsed[k].Seconds() }
	for k, name := range names {
		b.ReportMetric(rate(k), name+"-msgs/s")
	}
	b.ReportMetric(100*(rate(0)-rate(1))/rate(0), "no-exporter-overhead-%")
	b.ReportMetric(100*(rate(0)-rate(2))/rate(0), "traced-overhead-%")
}

// drainRig is one relay with its own database schema and Kafka cluster.
type drainRig struct {
	db        *testenv.DB
	store     *outbox.Store
	published chan int
	keys      []string
	events    []envelope.Event
	seq       int
	bctx      context.Context
}

func newDrainRig(b *testing.B, providers func(*testing.B) (metric.MeterProvider, trace.TracerProvider)) *drainRig {
	ctx := context.Background()
	mp, tp := providers(b)
	r := &drainRig{db: testenv.NewDB(b), published: make(chan int, 1024), events: make([]envelope.Event, drainRowsPerOp)}
	kc := testenv.NewKafka(b)
	kc.CreateTopic(b, drainTopic, 8)
	var err error
	if r.store, err = outbox.NewStore(r.db.Schema); err != nil {
		b.Fatal(err)
	}
	relay, err := outbox.NewRelay(r.db.Pool, kc.NewClient(b, outbox.ProducerOpts()...), outbox.RelayConfig{
		Schema: r.db.Schema, MeterProvider: mp, TracerProvider: tp, Logger: slog.New(slog.DiscardHandler),
		PollInterval: 10 * time.Millisecond, MaintenanceInterval: time.Hour,
		OnBatch: func(res outbox.BatchResult) { r.published <- res.Published },
	})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	b.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	r.keys = make([]string, 50)
	for i := range r.keys {
		r.keys[i] = fmt.Sprintf("customer-%d", i)
	}
	// A traced business context, so rows carry a stored traceparent as in production.
	var span trace.Span
	r.bctx, span = sdktrace.NewTracerProvider().Tracer("bench").Start(ctx, "POST /orders")
	span.End()
	return r
}

const drainTopic = "bench.orders.v1"

// round commits drainRowsPerOp rows and returns the time from the commit until the relay has
// published them all.
func (r *drainRig) round(b *testing.B) time.Duration {
	for i := range r.events {
		r.seq++
		r.events[i] = envelope.Event{
			MessageID: fmt.Sprintf("m-%09d", r.seq), Source: "ordering", Destination: drainTopic, Key: &r.keys[r.seq%len(r.keys)],
			EventType: "OrderPlaced", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
			Payload: []byte(`{"order":1}`), OccurredAt: time.Now().UTC(),
		}
	}
	var start time.Time
	if err := pgx.BeginFunc(r.bctx, r.db.Pool, func(tx pgx.Tx) error {
		_, err := r.store.EnqueueTx(r.bctx, tx, r.events...)
		start = time.Now()
		return err
	}); err != nil {
		b.Fatal(err)
	}
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	for n := 0; n < drainRowsPerOp; {
		select {
		case p := <-r.published:
			n += p
		case <-timeout.C:
			b.Fatalf("relay published %d of %d rows", n, drainRowsPerOp)
		}
	}
	return time.Since(start)
}
