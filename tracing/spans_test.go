package tracing

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/keiro-go/keiro/envelope"
)

const storedParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func TestSpanNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "send billing.orders.v1", SendSpanName("billing.orders.v1"))
	require.Equal(t, "process billing.orders.v1", ProcessSpanName("billing.orders.v1"))
	require.Equal(t, "7", PartitionID(7))
	require.Equal(t, "-1", PartitionID(-1))
}

func TestRecordTraceContextNoSDKForwardsStored(t *testing.T) {
	t.Parallel()
	stored := &envelope.TraceContext{Traceparent: storedParent, Tracestate: "k=v"}
	// Without a recording span (no SDK: the send span is a no-op that only carries the remote
	// parent), the stored context goes out verbatim, tracestate included.
	ctx := ContextWith(context.Background(), stored)
	ctx, span := tracenoop.NewTracerProvider().Tracer("t").Start(ctx, "send x")
	defer span.End()
	require.Equal(t, stored, RecordTraceContext(ctx, stored))
	require.Nil(t, RecordTraceContext(context.Background(), nil))
}

func TestRecordTraceContextRecordingSpanReplacesStored(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	stored := &envelope.TraceContext{Traceparent: storedParent, Tracestate: "k=v"}

	ctx, span := Tracer(tp).Start(ContextWith(context.Background(), stored), SendSpanName("x"), trace.WithSpanKind(trace.SpanKindProducer))
	got := RecordTraceContext(ctx, stored)
	span.End()
	require.NotNil(t, got)
	sc := span.SpanContext()
	require.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", got.Traceparent)
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", sc.TraceID().String(), "same trace as the stored context")
	require.Equal(t, "k=v", got.Tracestate, "tracestate travels on")

	// A sampled-out span is not recording: the stored context goes out.
	tpOff := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = tpOff.Shutdown(context.Background()) })
	ctx, span = Tracer(tpOff).Start(context.Background(), "send x")
	defer span.End()
	require.Equal(t, stored, RecordTraceContext(ctx, stored))
}

func TestProcessSpanStartParentAndLink(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	tc := &envelope.TraceContext{Traceparent: storedParent}
	ctx, opts := ProcessSpanStart(context.Background(), tc)
	_, span := Tracer(tp).Start(ctx, ProcessSpanName("orders"), opts...)
	span.End()

	spans := rec.Ended()
	require.Len(t, spans, 1)
	s := spans[0]
	require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", s.Parent().TraceID().String())
	require.Equal(t, "b7ad6b7169203331", s.Parent().SpanID().String())
	require.True(t, s.Parent().IsRemote())
	require.Len(t, s.Links(), 1)
	require.Equal(t, s.Parent().SpanID(), s.Links()[0].SpanContext.SpanID(), "link to the creation context")

	// No or broken trace context: a root span without links.
	for _, bad := range []*envelope.TraceContext{nil, {Traceparent: "garbage"}} {
		ctx, opts := ProcessSpanStart(context.Background(), bad)
		_, span := Tracer(tp).Start(ctx, "process orders", opts...)
		span.End()
		last := rec.Ended()[len(rec.Ended())-1]
		require.False(t, last.Parent().IsValid())
		require.Empty(t, last.Links())
		require.Equal(t, trace.SpanKindConsumer, last.SpanKind())
	}
}
