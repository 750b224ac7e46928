package keirotest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox/handlers"
	"github.com/keiro-go/keiro/keirotest"
	"github.com/keiro-go/keiro/outbox"
)

// Consume → produce: billing's handler turns each OrderPlaced it consumes into an
// InvoiceIssued enqueued in the inbox transaction (handlers.Forward), the relay publishes the
// outbox, and the invoices topic holds each invoice once, in key order, although every order
// was delivered twice.
func ExampleRequireExactlyOnce() {
	test(func(t testing.TB) {
		db := keirotest.NewDB(t)
		kafka := keirotest.NewKafka(t, "billing.invoices.v1")
		store, err := outbox.NewStore(db.Schema)
		if err != nil {
			t.Fatal(err)
		}
		issueInvoice, err := handlers.Forward(store, func(_ context.Context, order envelope.Event) ([]envelope.Event, error) {
			return []envelope.Event{{ // the message id is derived from the order's: handlers.ForwardedMessageID
				Source: "billing", Destination: "billing.invoices.v1", Key: order.Key, EventType: "InvoiceIssued",
				SchemaVersion: 1, ContentType: envelope.ContentTypeJSON, Payload: order.Payload, OccurredAt: order.OccurredAt,
			}}, nil
		})
		if err != nil {
			t.Fatal(err)
		}

		var invoices []string
		for _, id := range []string{"1001", "1002"} {
			order := keirotest.JSONEvent(t, "OrderPlaced", map[string]string{"order": id})
			order.MessageID, order.Source, order.Key = "order-placed-"+id, "ordering", &id
			keirotest.Deliver(t, db.Pool, order, keirotest.DeliverConfig{Handler: issueInvoice, Twice: true})
			invoices = append(invoices, handlers.ForwardedMessageID(order, 0))
		}
		keirotest.DrainOutbox(t, db.Pool, kafka)

		recs := keirotest.RequireExactlyOnce(t, kafka, "billing.invoices.v1", keirotest.ExactlyOnce{MessageIDs: invoices})
		for _, r := range recs {
			fmt.Println(r.Event.EventType, *r.Event.Key, string(r.Event.Payload))
		}
	})
	// Output:
	// InvoiceIssued 1001 {"order":"1001"}
	// InvoiceIssued 1002 {"order":"1002"}
}
