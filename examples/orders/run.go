package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

// Config is what Run needs.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string.
	DatabaseURL string
	// Schema is the schema to migrate and use.
	Schema string
	// OrderIDs are the three order numbers to place.
	OrderIDs []string
}

// Run migrates the schema, runs the demo commands, lets the integration producer catch up and
// prints what happened to out.
func Run(ctx context.Context, cfg Config, out io.Writer) error {
	if len(cfg.OrderIDs) != 3 {
		return errors.New("want three order ids")
	}
	conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	err = migrations.Migrate(ctx, conn, cfg.Schema)
	_ = conn.Close(ctx)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("open pool: %w", err)
	}
	defer pool.Close()

	store, err := events.NewStore(events.StoreConfig{Schema: cfg.Schema})
	if err != nil {
		return err
	}
	codec, err := NewOrderCodec()
	if err != nil {
		return err
	}
	orders, err := events.NewRunner(store, OrderDecider, codec, events.RunnerConfig[Order]{SnapshotEvery: 10})
	if err != nil {
		return err
	}

	// The commands of a small business day.
	a, b, c := "order-"+cfg.OrderIDs[0], "order-"+cfg.OrderIDs[1], "order-"+cfg.OrderIDs[2]
	steps := []struct {
		stream string
		cmd    any
	}{
		{a, PlaceOrder{Customer: "ada", Items: []Item{{SKU: "book", Quantity: 2, Price: 1500}}}},
		{b, PlaceOrder{Customer: "grace", Items: []Item{{SKU: "lamp", Quantity: 1, Price: 4200}}}},
		{c, PlaceOrder{Customer: "alan", Items: nil}},
		{a, PayOrder{Amount: 3000}},
		{a, PayOrder{Amount: 3000}},
		{b, CancelOrder{Reason: "changed mind"}},
		{b, PayOrder{Amount: 4200}},
	}
	for _, st := range steps {
		// Creation commands skip the hydration round trip; the runner checks for real if the
		// order exists after all.
		_, creates := st.cmd.(PlaceOrder)
		res, err := orders.Run(ctx, pool, st.stream, st.cmd, events.RunOptions{AssumeNew: creates})
		switch {
		case errors.Is(err, ErrRejected):
			fmt.Fprintf(out, "%-11s %-11s rejected: %s\n", label(st.stream, cfg), fmt.Sprintf("%T", st.cmd)[5:],
				strings.TrimPrefix(errors.Unwrap(err).Error(), ErrRejected.Error()+": "))
		case err != nil:
			return err
		case len(res.Events) == 0:
			fmt.Fprintf(out, "%-11s %-11s no-op (version %d)\n", label(st.stream, cfg), fmt.Sprintf("%T", st.cmd)[5:], res.StreamVersion)
		default:
			fmt.Fprintf(out, "%-11s %-11s -> %s (version %d)\n", label(st.stream, cfg), fmt.Sprintf("%T", st.cmd)[5:], res.Events[0].Type, res.StreamVersion)
		}
	}

	// The integration producer: private events → public events in the outbox, in the same
	// transaction as its checkpoint, under deterministic message ids.
	if err := CatchUp(ctx, pool, store, cfg.Schema); err != nil {
		return err
	}

	rows, err := pool.Query(ctx, `SELECT destination, message_key, event_type, status, convert_from(payload_bytes, 'UTF8')
		FROM `+cfg.Schema+`.keiro_outbox WHERE message_key = ANY($1) ORDER BY seq`, cfg.OrderIDs)
	if err != nil {
		return fmt.Errorf("list outbox: %w", err)
	}
	defer rows.Close()
	fmt.Fprintln(out, "outbox, waiting for the relay:")
	for rows.Next() {
		var dest, key, typ, status, payload string
		if err := rows.Scan(&dest, &key, &typ, &status, &payload); err != nil {
			return fmt.Errorf("list outbox: %w", err)
		}
		fmt.Fprintf(out, "  %s key=%s %-14s %-7s %s\n", dest, label("order-"+key, cfg), typ, status, payload)
	}
	return rows.Err()
}

// CatchUp runs the integration producer (private order events → public events in the outbox of
// schema, in the same transaction as its checkpoint, under deterministic message ids) until it
// has handled every event committed when it was called, then stops it. A real service keeps
// the producer running instead.
func CatchUp(ctx context.Context, pool *pgxpool.Pool, store *events.Store, schema string) error {
	ob, err := outbox.NewStore(schema)
	if err != nil {
		return err
	}
	head, err := store.Head(ctx, pool)
	if err != nil {
		return err
	}
	if head == 0 {
		return nil // no event yet
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	producer, err := events.NewProducer(store, pool, events.ProducerConfig{
		Name: "ordering-integration-producer", Source: Source, MessageIDPrefix: "msg", Category: "order",
		Map: MapToIntegration, Outbox: ob,
		AfterCommit: func(pos int64) {
			if pos >= head {
				cancel() // caught up
			}
		},
	})
	if err != nil {
		return err
	}
	if err := producer.Run(pctx); err != nil {
		return err
	}
	return ctx.Err()
}

// label names an order by its position in the run ("order#1"), so the output does not depend
// on the order numbers.
func label(stream string, cfg Config) string {
	for i, id := range cfg.OrderIDs {
		if stream == "order-"+id {
			return fmt.Sprintf("order#%d", i+1)
		}
	}
	return stream
}
