package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
)

// placeOrder writes an order and its OrderPlaced event in one transaction: both commit, or neither.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, id string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
			return err
		}
		_, err := outbox.EnqueueTx(ctx, tx, envelope.Event{
			MessageID: "order-placed-" + id, Source: "ordering", Destination: "orders.v1", Key: &id,
			EventType: "OrderPlaced", ContentType: envelope.ContentTypeJSON,
			Payload: fmt.Appendf(nil, `{"id":%q}`, id), OccurredAt: time.Now(),
		})
		return err
	})
}

// publishAndShip runs a relay, which publishes the outbox to Kafka (cmd/relay is the same relay
// as a sidecar), and a consumer that applies each event once: its effect and its inbox row
// commit in one transaction.
func publishAndShip(ctx context.Context, pool *pgxpool.Pool, brokers []string) error {
	client, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers(brokers...))...)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, client, outbox.RelayConfig{})
	if err != nil {
		return err
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()
	consumer, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{
		Brokers: brokers, Group: "shipping", Topics: []string{"orders.v1"},
	}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, *ev.Key)
		return err
	})
	if err != nil {
		return err
	}
	return errors.Join(consumer.Run(ctx), <-relayDone)
}
