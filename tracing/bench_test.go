package tracing_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/tracing"
	"github.com/keiro-go/keiro/tracing/otelsetup"
)

// BenchmarkPerRecordInstrumentation measures what the relay's telemetry costs per published
// record — a send span with its attributes, the trace context for the headers, the published
// counter and the latency histogram — under three setups:
//
//   - uninstrumented: the otel API's no-op providers (the floor, "no instrumentation at all");
//   - no-exporter: otelsetup.Setup with nothing configured, i.e. what the relay binary runs by
//     default: SDK metrics behind the Prometheus exporter, no tracer provider;
//   - traced: additionally an SDK tracer that samples every span into a batch processor whose
//     exporter discards them (the SDK's cost without a network).
//
// The difference between the first two, divided by the relay's time per record (see the relay
// drain benchmark in docs/benchmarks-history.md), is the instrumentation overhead.
func BenchmarkPerRecordInstrumentation(b *testing.B) {
	stored := &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	run := func(b *testing.B, mp metric.MeterProvider, tp trace.TracerProvider) {
		m := tracing.Meter(mp)
		published, err := m.Int64Counter(tracing.MetricOutboxPublished, metric.WithUnit("{event}"))
		if err != nil {
			b.Fatal(err)
		}
		latency, err := m.Float64Histogram(tracing.MetricOutboxPublishLatency, metric.WithUnit("s"))
		if err != nil {
			b.Fatal(err)
		}
		tracer := tracing.Tracer(tp)
		dest := metric.WithAttributes(tracing.DestinationKey.String("billing.orders.v1"))
		created := time.Now()
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			sctx, span := tracer.Start(tracing.ContextWith(ctx, stored), tracing.SendSpanName("billing.orders.v1"),
				trace.WithSpanKind(trace.SpanKindProducer))
			if span.IsRecording() {
				span.SetAttributes(
					tracing.MessagingSystemKey.String(tracing.MessagingSystemKafka),
					tracing.MessagingOperationTypeKey.String(tracing.OperationSend),
					tracing.MessagingOperationNameKey.String(tracing.OperationSend),
					tracing.MessagingDestinationNameKey.String("billing.orders.v1"),
					tracing.MessagingMessageIDKey.String("0193a3f0-0000-7000-8000-000000000001"),
					tracing.MessagingKafkaMessageKeyKey.String("order-42"),
					tracing.OutboxAttemptKey.Int(1),
				)
			}
			_ = tracing.RecordTraceContext(sctx, stored)
			if span.IsRecording() {
				span.SetAttributes(
					tracing.MessagingDestinationPartitionIDKey.String(tracing.PartitionID(3)),
					attribute.Int64(string(tracing.MessagingKafkaOffsetKey), 1234),
				)
			}
			span.End()
			published.Add(ctx, 1, dest)
			latency.Record(ctx, time.Since(created).Seconds(), dest)
		}
	}
	b.Run("uninstrumented", func(b *testing.B) {
		run(b, metricnoop.NewMeterProvider(), tracenoop.NewTracerProvider())
	})
	b.Run("no-exporter", func(b *testing.B) {
		tel, err := otelsetup.Setup(context.Background(), otelsetup.Options{NoGlobals: true, Getenv: func(string) string { return "" }})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = tel.Shutdown(context.Background()) }()
		run(b, tel.MeterProvider(), tel.TracerProvider())
	})
	b.Run("traced", func(b *testing.B) {
		tel, err := otelsetup.Setup(context.Background(), otelsetup.Options{NoGlobals: true, Getenv: func(string) string { return "" }})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = tel.Shutdown(context.Background()) }()
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		run(b, tel.MeterProvider(), tp)
	})
}

// discardExporter drops spans: the benchmark measures the SDK, not an exporter.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }
