package tracing

import (
	"context"

	"go.opentelemetry.io/otel/propagation"

	"github.com/keiro-go/keiro/envelope"
)

// w3c is the W3C Trace Context propagator. keiro's wire contract carries exactly traceparent and
// tracestate, whatever global propagator the application installed.
var w3c = propagation.TraceContext{}

// FromContext captures the W3C trace context of the span in ctx, for storing on an outbox row.
// It returns nil when ctx carries no valid span context.
func FromContext(ctx context.Context) *envelope.TraceContext {
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	tp := c[envelope.HeaderTraceparent]
	if tp == "" {
		return nil
	}
	return &envelope.TraceContext{Traceparent: tp, Tracestate: c[envelope.HeaderTracestate]}
}

// ContextWith returns ctx carrying tc as its remote span context, so spans started from it
// continue tc's trace. A nil or unparsable tc returns ctx unchanged.
func ContextWith(ctx context.Context, tc *envelope.TraceContext) context.Context {
	if tc == nil || tc.Traceparent == "" {
		return ctx
	}
	c := propagation.MapCarrier{envelope.HeaderTraceparent: tc.Traceparent}
	if tc.Tracestate != "" {
		c[envelope.HeaderTracestate] = tc.Tracestate
	}
	return w3c.Extract(ctx, c)
}
