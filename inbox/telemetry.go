package inbox

import (
	"context"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/tracing"
)

// scope is the OpenTelemetry instrumentation scope of every keiro instrument.
const scope = "keiro"

type instruments struct {
	tracer          trace.Tracer
	processed       metric.Int64Counter
	duplicates      metric.Int64Counter
	failed          metric.Int64Counter
	poisoned        metric.Int64Counter
	deadlettered    metric.Int64Counter
	handlerDuration metric.Float64Histogram
	backlog         metric.Int64Gauge
	lag             metric.Int64Gauge
}

func newInstruments(mp metric.MeterProvider, tp trace.TracerProvider) (*instruments, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(scope)
	in := &instruments{tracer: tp.Tracer(scope)}
	var errs [9]error
	in.processed, errs[0] = m.Int64Counter("keiro.inbox.processed", metric.WithUnit("{message}"),
		metric.WithDescription("Messages whose handler committed."))
	in.duplicates, errs[1] = m.Int64Counter("keiro.inbox.duplicates", metric.WithUnit("{message}"),
		metric.WithDescription("Redelivered messages skipped by the inbox."))
	in.failed, errs[2] = m.Int64Counter("keiro.inbox.failed", metric.WithUnit("{message}"),
		metric.WithDescription("Handler failures and deliveries of previously failed messages."))
	in.poisoned, errs[3] = m.Int64Counter("keiro.inbox.poisoned", metric.WithUnit("{message}"),
		metric.WithDescription("Messages that reached the attempt ceiling or failed permanently."))
	in.deadlettered, errs[4] = m.Int64Counter("keiro.inbox.deadlettered", metric.WithUnit("{message}"),
		metric.WithDescription("Records produced to the dead-letter topic."))
	in.handlerDuration, errs[5] = m.Float64Histogram("keiro.inbox.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("Time spent in the handler."))
	in.backlog, errs[6] = m.Int64Gauge("keiro.inbox.backlog", metric.WithUnit("{message}"),
		metric.WithDescription("Failed inbox rows of this consumer."))
	in.lag, errs[7] = m.Int64Gauge("keiro.consumer.lag", metric.WithUnit("{message}"),
		metric.WithDescription("High watermark minus committed offset, per partition."))
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("create inbox instruments: %w", err)
		}
	}
	return in, nil
}

func (in *instruments) count(ctx context.Context, consumer, topic string, res Result) {
	attrs := metric.WithAttributes(attribute.String("consumer", consumer), attribute.String("topic", topic))
	switch res.Outcome {
	case Processed:
		in.processed.Add(ctx, 1, attrs)
	case Duplicate:
		in.duplicates.Add(ctx, 1, attrs)
	case PreviouslyFailed:
		if res.DeadLettered {
			in.duplicates.Add(ctx, 1, attrs) // a redelivered dead letter
		} else {
			in.failed.Add(ctx, 1, attrs)
		}
	case HandlerFailed:
		in.failed.Add(ctx, 1, attrs)
	case Poisoned:
		in.failed.Add(ctx, 1, attrs)
		in.poisoned.Add(ctx, 1, attrs)
	}
}

// startProcessSpan starts the `process <topic>` consumer span. Its parent is the record's trace
// context (so one trace runs from the producing transaction to the consumer's effects), and it
// links to that same context (the semantic conventions' creation context).
func (in *instruments) startProcessSpan(ctx context.Context, group string, d *Delivery) (context.Context, trace.Span) {
	topic := d.Event.Destination
	if d.Kafka != nil {
		topic = d.Kafka.Topic
	}
	pctx := tracing.ContextWith(ctx, d.Event.TraceContext)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	if sc := trace.SpanContextFromContext(pctx); sc.IsValid() && sc.IsRemote() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	ctx, span := in.tracer.Start(pctx, "process "+topic, opts...)
	if !span.IsRecording() {
		return ctx, span // no SDK or not sampled: skip building the attributes
	}
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.destination.name", topic),
	}
	if d.Kafka != nil {
		attrs = append(attrs,
			attribute.String("messaging.destination.partition.id", strconv.Itoa(int(d.Kafka.Partition))),
			attribute.Int64("messaging.kafka.offset", d.Kafka.Offset))
	}
	if d.Event.Key != nil {
		attrs = append(attrs, attribute.String("messaging.kafka.message.key", *d.Event.Key))
	}
	if group != "" {
		attrs = append(attrs, attribute.String("messaging.consumer.group.name", group))
	}
	if d.Event.MessageID != "" {
		attrs = append(attrs, attribute.String("messaging.message.id", d.Event.MessageID))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

func endProcessSpan(span trace.Span, res Result, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	outcome := "failed"
	switch res.Outcome {
	case Processed:
		outcome = "processed"
	case Duplicate:
		outcome = "duplicate"
	case Poisoned:
		outcome = "poisoned"
	case Deferred:
		outcome = "deferred"
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.String("keiro.inbox.outcome", outcome))
		if res.Err != nil {
			span.RecordError(res.Err)
			span.SetStatus(codes.Error, res.Err.Error())
		}
	}
	span.End()
}
