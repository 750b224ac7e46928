package keirotest_test

import (
	"testing"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest"
)

const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceparent = "00-" + traceID + "-00f067aa0ba902b7-01"
)

func TestRequirePublishedHeaders(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	kafka := keirotest.NewKafka(t, "ordering.orders.v1")
	corr, _ := envelope.ParseUUID("0190b0a8-7c4e-7d2a-9f1e-5b3c2d1e0f4a")
	schemaID := int64(42)
	ev := orderEvent(t, "1001", "ada", 3000)
	ev.CorrelationID, ev.TraceContext = &corr, &envelope.TraceContext{Traceparent: traceparent}
	ev.SchemaRef = &envelope.SchemaRef{SchemaID: &schemaID}
	enqueue(t, db, ev, orderEvent(t, "1002", "grace", 4200))
	keirotest.DrainOutbox(t, db.Pool, kafka) // the relay writes the headers

	recs := keirotest.RequirePublished(t, kafka, "ordering.orders.v1", keirotest.Published{Count: 1},
		keirotest.WithCorrelationID("0190B0A8-7C4E-7D2A-9F1E-5B3C2D1E0F4A"), keirotest.WithTraceParent(traceparent),
		keirotest.WithTraceID(traceID), keirotest.WithSchemaID(42), keirotest.WithHeader("keiro-source", "ordering"),
		keirotest.WithoutHeader("keiro-causation-id"))
	if recs[0].Event.MessageID != "placed-1001" {
		t.Fatalf("want the record of order 1001, got %s", recs[0].Event.MessageID)
	}

	t.Run("the failure shows the records' headers", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequirePublished(tb, kafka, "ordering.orders.v1", keirotest.Published{Key: "1001"},
				keirotest.WithCorrelationID("0190b0a8-7c4e-7d2a-9f1e-000000000000"), keirotest.WithSchemaID(7))
		})
		requireFailure(t, r, `want: key "1001", header keiro-correlation-id="0190b0a8-7c4e-7d2a-9f1e-000000000000", header keiro-schema-id=7`,
			`headers: keiro-message-id="placed-1001" keiro-source="ordering"`, `keiro-correlation-id="0190b0a8-7c4e-7d2a-9f1e-5b3c2d1e0f4a"`,
			`differs: header "keiro-correlation-id" is "0190b0a8-7c4e-7d2a-9f1e-5b3c2d1e0f4a", want "0190b0a8-7c4e-7d2a-9f1e-000000000000"; `+
				`header "keiro-schema-id" is "42", want "7"`,
			`differs: key is "1002", want "1001"; it has no header "keiro-correlation-id", want "0190b0a8-7c4e-7d2a-9f1e-000000000000"`)
	})
	t.Run("a trace of another id", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequirePublished(tb, kafka, "ordering.orders.v1", keirotest.Published{Key: "1001"},
				keirotest.WithTraceID("0af7651916cd43dd8448eb211c80319c"), keirotest.WithHeader("keiro-source", "billing"),
				keirotest.WithoutHeader("traceparent"))
		})
		requireFailure(t, r, `header "traceparent" is "`+traceparent+`", want a traceparent of trace 0af7651916cd43dd8448eb211c80319c`,
			`header "keiro-source" is "ordering", want "billing"`, `header "traceparent" is "`+traceparent+`", want none`)
	})
	t.Run("invalid matchers fail before reading", func(t *testing.T) {
		for _, tc := range []struct {
			m    keirotest.HeaderMatcher
			want string
		}{
			{keirotest.WithCorrelationID("order-1001"), `WithCorrelationID("order-1001"): not a UUID`},
			{keirotest.WithCausationID(""), `WithCausationID(""): not a UUID`},
			{keirotest.WithTraceParent("00-abc"), `WithTraceParent("00-abc"): not a W3C traceparent`},
			{keirotest.WithTraceID("ABC"), `WithTraceID("ABC"): not a trace id`},
			{keirotest.WithHeader("", "x"), "WithHeader: the header name is empty"},
			{nil, "header matcher 1 is nil"},
		} {
			r := record(t, func(tb testing.TB) {
				keirotest.RequirePublished(tb, kafka, "ordering.orders.v1", keirotest.Published{}, tc.m)
			})
			requireFailure(t, r, "keirotest.RequirePublished: "+tc.want)
		}
	})
}

// TestRequireDeadLetteredHeaders: a dead letter keeps the original record's headers, which the
// header matchers check.
func TestRequireDeadLetteredHeaders(t *testing.T) {
	t.Parallel()
	db := newInvoices(t)
	kafka := keirotest.NewKafka(t, "ordering.orders.v1")
	c := keirotest.RunConsumer(t, db.Pool, kafka, applyInvoice, inbox.ConsumerConfig{Topics: []string{"ordering.orders.v1"}})
	ev := orderEvent(t, "1002", "grace", -5)
	ev.TraceContext = &envelope.TraceContext{Traceparent: traceparent}
	keirotest.Produce(t, kafka, ev)
	c.WaitDeadLettered(t, ev.MessageID)
	keirotest.RequireDeadLettered(t, kafka, "ordering.orders.v1.dlq", keirotest.DeadLettered{MessageID: ev.MessageID},
		keirotest.WithTraceID(traceID), keirotest.WithHeader(inbox.HeaderDLQReason, inbox.ReasonPermanent))
	r := record(t, func(tb testing.TB) {
		keirotest.RequireDeadLettered(tb, kafka, "ordering.orders.v1.dlq", keirotest.DeadLettered{},
			keirotest.WithHeader(inbox.HeaderDLQConsumer, "billing"))
	})
	requireFailure(t, r, `want: any dead letter, header keiro-dlq-consumer="billing"`,
		`headers: keiro-message-id="placed-1002"`, `keiro-dlq-reason="permanent"`,
		`differs: header "keiro-dlq-consumer" is "keirotest", want "billing"`)
}
