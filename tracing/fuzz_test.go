package tracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
)

// FuzzContextWith feeds arbitrary traceparent/tracestate header values (outside bytes from Kafka
// records and outbox rows) through the W3C decode: never a panic; a context is only continued
// when it is valid, and then re-encoding it yields a valid traceparent of the same trace.
func FuzzContextWith(f *testing.F) {
	f.Add("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k=v")
	f.Add("00-00000000000000000000000000000000-b7ad6b7169203331-01", "")
	f.Add("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a=1,b=2")
	f.Add("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", "=,")
	f.Add("", "k=v")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		tc := &envelope.TraceContext{Traceparent: tp, Tracestate: ts}
		ctx := ContextWith(context.Background(), tc)
		sc := trace.SpanContextFromContext(ctx)
		pctx, opts := ProcessSpanStart(context.Background(), tc)
		if !sc.IsValid() {
			if len(opts) != 1 || pctx != context.Background() {
				t.Fatalf("invalid context %q must start a root span without link", tp)
			}
			return
		}
		if !sc.IsRemote() || len(opts) != 2 {
			t.Fatalf("valid context %q: remote=%v opts=%d", tp, sc.IsRemote(), len(opts))
		}
		out := FromContext(ctx)
		if out == nil || !strings.Contains(out.Traceparent, sc.TraceID().String()) {
			t.Fatalf("re-encoding %q gave %+v", tp, out)
		}
		if again := trace.SpanContextFromContext(ContextWith(context.Background(), out)); !again.Equal(sc) {
			t.Fatalf("round trip of %q changed the context: %v != %v", tp, again, sc)
		}
	})
}
