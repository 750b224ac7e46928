package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/workflow"
)

// The shipping context's durable workflow: each order billed starts a "shipment" workflow in
// the consumer's inbox transaction. It reserves stock and then ships, each a step whose row
// commits with its journal entry; shipping_parcels counts each step's runs per order, so a step
// that ran twice would show as a count of 2.
func shippingDDL(s string) string {
	return fmt.Sprintf(`
CREATE TABLE %[1]s.shipping_parcels (
  order_id     text   PRIMARY KEY,
  reservations bigint NOT NULL DEFAULT 0,
  shipments    bigint NOT NULL DEFAULT 0
);`, s)
}

// shipping holds the shipment workflow and the worker that runs it.
type shipping struct {
	schema string
	flow   *workflow.Workflow[OrderPlacedV1, string]
	worker *workflow.Worker
}

func newShipping(schema string, pool *pgxpool.Pool) (*shipping, error) {
	e, err := workflow.New(pool, workflow.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	reserve := `INSERT INTO ` + schema + `.shipping_parcels AS p (order_id, reservations) VALUES ($1, 1)
ON CONFLICT (order_id) DO UPDATE SET reservations = p.reservations + 1`
	ship := `UPDATE ` + schema + `.shipping_parcels SET shipments = shipments + 1 WHERE order_id = $1`
	flow, err := workflow.Register(e, "shipment", func(c *workflow.Context, o OrderPlacedV1) (string, error) {
		if _, err := workflow.Step(c, "reserve", func(ctx context.Context, tx pgx.Tx) (bool, error) {
			_, err := tx.Exec(ctx, reserve, o.OrderID)
			return true, err
		}); err != nil {
			return "", err
		}
		return workflow.Step(c, "ship", func(ctx context.Context, tx pgx.Tx) (string, error) {
			_, err := tx.Exec(ctx, ship, o.OrderID)
			return "parcel-" + o.OrderID, err
		})
	})
	if err != nil {
		return nil, err
	}
	w, err := workflow.NewWorker(e, workflow.WorkerConfig{PollInterval: 200 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	return &shipping{schema: schema, flow: flow, worker: w}, nil
}

// inboxHandler starts the order's shipment in the delivery's transaction: a redelivered
// message starts nothing more.
func (s *shipping) inboxHandler() inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		var o OrderPlacedV1
		if err := json.Unmarshal(ev.Payload, &o); err != nil {
			return inbox.Permanent(fmt.Errorf("decode OrderPlaced %s: %w", ev.MessageID, err))
		}
		_, err := s.flow.StartTx(ctx, tx, o.OrderID, o)
		return err
	}
}

// settle waits until every shipment workflow has ended (or the deadline).
func (s *shipping) settle(ctx context.Context, pool *pgxpool.Pool, orders int, deadline <-chan time.Time) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var ended int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+s.schema+`.keiro_workflows
WHERE workflow_name = 'shipment' AND status IN ('completed', 'failed', 'cancelled')`).Scan(&ended)
		if err != nil {
			return fmt.Errorf("read the shipment workflows: %w", err)
		}
		if ended >= orders {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("%d of %d shipment workflows ended before the deadline", ended, orders)
		case <-tick.C:
		}
	}
}

// checks reads the shipment workflows' invariants.
func (s *shipping) checks(ctx context.Context, pool *pgxpool.Pool, orders int) ([]Check, error) {
	var completed, other, parcels, once, steps int
	err := pool.QueryRow(ctx, `SELECT
  (SELECT count(*) FROM `+s.schema+`.keiro_workflows WHERE workflow_name = 'shipment' AND status = 'completed'),
  (SELECT count(*) FROM `+s.schema+`.keiro_workflows WHERE workflow_name = 'shipment' AND status <> 'completed'),
  (SELECT count(*) FROM `+s.schema+`.shipping_parcels),
  (SELECT count(*) FROM `+s.schema+`.shipping_parcels WHERE reservations = 1 AND shipments = 1),
  (SELECT count(*) FROM `+s.schema+`.keiro_workflow_steps WHERE workflow_name = 'shipment')`).
		Scan(&completed, &other, &parcels, &once, &steps)
	if err != nil {
		return nil, fmt.Errorf("read the shipment workflows: %w", err)
	}
	return []Check{
		{Name: "shipment workflows completed", Value: fmt.Sprintf("%d of %d", completed, orders), OK: completed == orders && other == 0},
		{Name: "shipment steps ran once (reserve, ship)", Value: fmt.Sprintf("%d of %d parcels", once, parcels), OK: once == orders && parcels == orders},
		{Name: "shipment journal entries", Value: fmt.Sprint(steps), OK: steps == 2*orders},
	}, nil
}
