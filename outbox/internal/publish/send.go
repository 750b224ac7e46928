package publish

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/tracing"
)

// Send is one record's send: its span, and the start of its produce for the send metrics.
type Send struct {
	p     *Publisher
	span  trace.Span
	start time.Time
}

// StartSend starts ev's send span, a child of the trace context of ev's row, and returns it
// with the span's trace context for the record's headers (nil when the span is not
// recorded: the record then carries the row's own).
//
// A send costs the stream no tracing work when the publisher's tracer is a no-op one (no
// trace exporter configured): no context, no span, no attributes. Otherwise the span's name
// and the attributes of its destination, the same for every record of it, are built once per
// destination and given to the tracer at the start, where a sampler sees them; the record's
// own (message id, key) are set only on a span that is recorded.
func (p *Publisher) StartSend(ev *envelope.Event, attrs ...attribute.KeyValue) (*Send, *envelope.TraceContext) {
	if p.noopTracer {
		return &Send{p: p, span: noopSpan, start: time.Now()}, nil
	}
	sets := p.inst.setsOf(ev.Destination)
	opts := sets.spanStart
	if len(attrs) > 0 {
		opts = append(slices.Clip(opts), trace.WithAttributes(attrs...))
	}
	spanCtx, span := p.tracer.Start(tracing.ContextWith(context.Background(), ev.TraceContext), sets.spanName, opts...)
	s := &Send{p: p, span: span, start: time.Now()}
	if !span.IsRecording() {
		return s, nil
	}
	span.SetAttributes(tracing.MessagingMessageIDKey.String(ev.MessageID))
	if ev.Key != nil {
		span.SetAttributes(tracing.MessagingKafkaMessageKeyKey.String(*ev.Key))
	}
	return s, tracing.FromContext(spanCtx)
}

// noopSpan is the span of every send of a publisher whose tracer is a no-op one.
var noopSpan = func() trace.Span {
	_, span := tracenoop.NewTracerProvider().Tracer("").Start(context.Background(), "")
	return span
}()

// Rejected ends the span of a record rejected before it was sent, with its rejection code.
func (s *Send) Rejected(code string) {
	s.span.SetAttributes(tracing.OutboxRejectionCodeKey.String(code))
	s.span.End()
}

// Done records the produced record's outcome: the send metrics, the publish latency from
// origin (the row's creation, or its transaction's commit) when Kafka acknowledged it, and
// the span, which it ends.
func (s *Send) Done(rec *kgo.Record, err error, origin time.Time) {
	in := s.p.inst
	in.recordSend(rec, err, s.start)
	if err == nil {
		in.latency.Record(context.Background(), time.Since(origin).Seconds())
	}
	span := s.span
	if !span.IsRecording() { // not sampled, or no tracer: nothing to build
		span.End()
		return
	}
	if err == nil {
		span.SetAttributes(
			tracing.MessagingDestinationPartitionIDKey.String(tracing.PartitionID(rec.Partition)),
			tracing.MessagingKafkaOffsetKey.Int64(rec.Offset))
	} else {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// AddPublished counts n rows of destination published (Kafka acknowledged them, and the
// claim engine marked them sent).
func (p *Publisher) AddPublished(ctx context.Context, n int64, destination string) {
	p.inst.published.Add(ctx, n, p.inst.setsOf(destination).destAdd...)
}

// instruments are the publisher's metrics.
type instruments struct {
	published    metric.Int64Counter
	latency      metric.Float64Histogram
	sent         metric.Int64Counter
	sendDuration metric.Float64Histogram
	// sendSets caches the attribute sets of each destination (*sendSets).
	sendSets sync.Map
}

// newInstruments creates the publisher's instruments on m.
func newInstruments(m metric.Meter) (*instruments, error) {
	in := &instruments{}
	var err1, err2, err3, err4 error
	in.published, err1 = m.Int64Counter(tracing.MetricOutboxPublished, metric.WithDescription("Outbox rows acknowledged by Kafka and marked sent."), metric.WithUnit("{event}"))
	in.sent, err2 = m.Int64Counter(tracing.MetricClientSentMessages, metric.WithDescription("Records the relay produced to Kafka; error.type is set on those that failed."), metric.WithUnit("{message}"))
	in.latency, err3 = m.Float64Histogram(tracing.MetricOutboxPublishLatency, metric.WithDescription("Time from the row's creation (enqueue transaction start) to the broker's acknowledgement."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(tracing.LatencyBuckets...))
	in.sendDuration, err4 = m.Float64Histogram(tracing.MetricClientOperationDuration, metric.WithDescription("Duration of a produce, from the call to the broker's answer."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(tracing.LatencyBuckets...))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, fmt.Errorf("create publisher instruments: %w", err)
	}
	return in, nil
}

// DestinationAttr is the attribute set of a destination's outbox metrics.
func DestinationAttr(d string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(tracing.DestinationKey.String(d)))
}

// recordSend records one produce of rec in the semantic-convention client metrics: sent
// messages and operation duration, with error.type on failures.
func (in *instruments) recordSend(rec *kgo.Record, err error, start time.Time) {
	ctx := context.Background()
	if err == nil {
		sets := in.setsOf(rec.Topic)
		in.sent.Add(ctx, 1, sets.sentAdd...)
		in.sendDuration.Record(ctx, time.Since(start).Seconds(), sets.sentRecord...)
		return
	}
	set := sendMetricSet(rec.Topic, tracing.ErrorTypeKey.String(ErrorType(err)))
	in.sent.Add(ctx, 1, set)
	in.sendDuration.Record(ctx, time.Since(start).Seconds(), set)
}

// sendSets are a destination's attribute sets, built once: the outbox metrics', the
// successful sends', and its send spans' name and start options. The options are kept as the
// slices the instruments take, so that a measurement allocates none.
type sendSets struct {
	destAdd    []metric.AddOption
	sentAdd    []metric.AddOption
	sentRecord []metric.RecordOption
	spanName   string
	spanStart  []trace.SpanStartOption
}

// sendMetricSet is the attribute set of the send metrics of topic, with extra (error.type for
// a failed send).
func sendMetricSet(topic string, extra ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{
		tracing.MessagingSystemKey.String(tracing.MessagingSystemKafka),
		tracing.MessagingOperationNameKey.String(tracing.OperationSend),
		tracing.DestinationKey.String(topic)}, extra...)...))
}

// setsOf returns topic's attribute sets.
func (in *instruments) setsOf(topic string) *sendSets {
	if v, ok := in.sendSets.Load(topic); ok {
		return v.(*sendSets)
	}
	sent := sendMetricSet(topic)
	v, _ := in.sendSets.LoadOrStore(topic, &sendSets{
		destAdd:    []metric.AddOption{DestinationAttr(topic)},
		sentAdd:    []metric.AddOption{sent},
		sentRecord: []metric.RecordOption{sent},
		spanName:   "send " + topic,
		spanStart: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
			tracing.MessagingSystemKey.String(tracing.MessagingSystemKafka),
			tracing.MessagingOperationTypeKey.String(tracing.OperationSend),
			tracing.MessagingOperationNameKey.String(tracing.OperationSend),
			tracing.MessagingDestinationNameKey.String(topic),
		)},
	})
	return v.(*sendSets)
}

// ErrorType is the error.type of a failed send: the Kafka error's name, or a short class.
func ErrorType(err error) string {
	var ke *kerr.Error
	switch {
	case errors.As(err, &ke):
		return ke.Message
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, kgo.ErrRecordTimeout):
		return "timeout"
	case errors.Is(err, context.Canceled), errors.Is(err, kgo.ErrAborting):
		return "canceled"
	case errors.Is(err, kgo.ErrMaxBuffered):
		return "max_buffered"
	}
	return fmt.Sprintf("%T", err)
}
