package tracing

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
)

// SendSpanName returns the relay's producer span name, "send <topic>".
func SendSpanName(topic string) string { return OperationSend + " " + topic }

// ProcessSpanName returns the consumer's span name, "process <topic>".
func ProcessSpanName(topic string) string { return OperationProcess + " " + topic }

// PartitionID formats a partition number for [MessagingDestinationPartitionIDKey] and
// [PartitionKey], which semconv defines as strings.
func PartitionID(partition int32) string { return strconv.FormatInt(int64(partition), 10) }

// RecordTraceContext returns the trace context to write into a produced record's traceparent
// and tracestate headers: the context of the span in ctx (the relay's send span) when that span
// is recording, otherwise stored (the context captured on the outbox row) unchanged. With no
// SDK installed the relay therefore forwards the business transaction's context verbatim.
func RecordTraceContext(ctx context.Context, stored *envelope.TraceContext) *envelope.TraceContext {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return stored
	}
	if tc := FromContext(ctx); tc != nil {
		return tc
	}
	return stored
}

// ProcessSpanStart prepares the consumer's "process <topic>" span from the trace context a
// record carried: the returned ctx has that context as remote parent (one trace from the
// business transaction to the consumer's effects), and the options make the span a Consumer
// span with a link to the same context (semconv's creation context). With a nil or unparsable
// tc, ctx is returned unchanged and the options carry no link.
func ProcessSpanStart(ctx context.Context, tc *envelope.TraceContext) (context.Context, []trace.SpanStartOption) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	pctx := ContextWith(ctx, tc)
	if sc := trace.SpanContextFromContext(pctx); sc.IsValid() && sc.IsRemote() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		return pctx, opts
	}
	return ctx, opts
}
