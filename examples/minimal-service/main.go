// Command minimal-service is the smallest service that uses keiro as a library: POST /orders
// writes an order and its OrderPlaced integration event in one transaction (outbox.EnqueueTx),
// an in-process relay publishes the outbox to Kafka, and an in-process consumer applies each
// event exactly once (inbox) by recording it in a table.
//
// It imports only the library packages (outbox, inbox, envelope), so its binary carries
// neither OpenTelemetry exporters nor the migration runner; the schema is migrated beforehand
// with `relay migrate` (or migrations.Migrate), and tables orders and shipments are created by
// the service's own migrations:
//
//	CREATE TABLE orders (id text PRIMARY KEY);
//	CREATE TABLE shipments (order_id text PRIMARY KEY);
//
// docs/benchmarks-history.md records its binary size, next to internal/depcheck/testdata/floor,
// the same service written against pgx and franz-go alone.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
)

const topic = "orders.v1"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv("DATABASE_URL"), strings.Split(os.Getenv("KAFKA_BROKERS"), ",")); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dsn string, brokers []string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()

	client, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers(brokers...))...)
	if err != nil {
		return err
	}
	defer client.Close()
	relay, err := outbox.NewRelay(pool, client, outbox.RelayConfig{})
	if err != nil {
		return err
	}
	consumer, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{
		Brokers: brokers, Group: "shipping", Topics: []string{topic},
	}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if ev.Key == nil {
			return inbox.Permanent(errors.New("OrderPlaced without a key: want the order id as the record key"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, *ev.Key)
		return err
	})
	if err != nil {
		return err
	}

	http.HandleFunc("POST /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := placeOrder(r.Context(), pool, r.PathValue("id")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	srv := &http.Server{Addr: "127.0.0.1:8080", ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.WithoutCancel(ctx))
	}()

	errc := make(chan error, 3)
	go func() { errc <- relay.Run(ctx) }()
	go func() { errc <- consumer.Run(ctx) }()
	go func() { errc <- srv.ListenAndServe() }()
	var errs []error
	for range 3 {
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
			cancel()
		}
	}
	return errors.Join(errs...)
}

// placeOrder writes the order and its integration event in one transaction: both commit or
// neither does.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, id string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
			return err
		}
		payload, err := json.Marshal(map[string]string{"id": id})
		if err != nil {
			return err
		}
		_, err = outbox.EnqueueTx(ctx, tx, envelope.Event{
			MessageID: "order-" + id, Source: "ordering", Destination: topic, Key: &id,
			EventType: "OrderPlaced", SchemaVersion: 1, ContentType: "application/json",
			Payload: payload, OccurredAt: time.Now().UTC(),
		})
		return err
	})
}
