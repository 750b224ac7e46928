package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// The consuming side: the billing context invoices paid orders. Its handler runs in the inbox
// transaction, so the invoice and the inbox row commit together and a redelivered OrderPaid
// never invoices twice.

// CreateBillingTables creates billing's table in schema.
func CreateBillingTables(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, schema string) error {
	_, err := db.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.invoices (
		order_id    text PRIMARY KEY,
		total_cents bigint NOT NULL
	)`, pgx.Identifier{schema}.Sanitize()))
	return err
}

// InvoicePaidOrders returns billing's inbox handler: an invoice for each OrderPaid, other
// order events ignored.
func InvoicePaidOrders(schema string) inbox.Handler {
	insert := fmt.Sprintf(`INSERT INTO %s.invoices (order_id, total_cents) VALUES ($1, $2)`,
		pgx.Identifier{schema}.Sanitize())
	return func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if ev.EventType != "OrderPaid" {
			return nil
		}
		var o publicOrder
		if err := envelope.DecodeJSON(&ev, &o); err != nil {
			return inbox.Permanent(fmt.Errorf("decode OrderPaid: %w", err))
		}
		if o.OrderID == "" || o.TotalCents <= 0 {
			return inbox.Permanent(fmt.Errorf("OrderPaid %s: an invoice needs an order id and a positive total", ev.MessageID))
		}
		_, err := tx.Exec(ctx, insert, o.OrderID, o.TotalCents)
		return err
	}
}
