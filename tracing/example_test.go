package tracing_test

import (
	"context"
	"fmt"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/tracing"
)

// The relay writes the send span's context into the record headers when tracing is on, and
// the context stored on the outbox row otherwise.
func ExampleRecordTraceContext() {
	stored := &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	ctx := tracing.ContextWith(context.Background(), stored)
	ctx, span := tracing.Tracer(nil).Start(ctx, tracing.SendSpanName("billing.orders.v1"))
	defer span.End()
	fmt.Println(tracing.RecordTraceContext(ctx, stored).Traceparent)
	// Output: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
}
