// Command floor is examples/minimal-service written against pgx and franz-go directly, with no
// keiro package: the same HTTP endpoint writing an order and its event in one transaction, a
// loop that publishes pending rows with an idempotent acks=all producer and marks them sent,
// and a consumer group that records each event in a transaction and commits its offsets
// afterwards. Its binary is the floor under the service's: what the dependencies cost a
// service that does this work at all. internal/depcheck compares the two
// (TestMinimalServiceBinary) and docs/benchmarks-history.md records both sizes.
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
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		return err
	}
	defer producer.Close()
	consumer, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("shipping"),
		kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
	if err != nil {
		return err
	}
	defer consumer.Close()

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
	go relay(ctx, pool, producer)
	go consume(ctx, pool, consumer)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func placeOrder(ctx context.Context, pool *pgxpool.Pool, id string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
			return err
		}
		payload, err := json.Marshal(map[string]string{"id": id})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO outbox (key, payload) VALUES ($1, $2)`, id, payload)
		return err
	})
}

// relay publishes pending outbox rows in order and marks each one sent once Kafka acked it.
func relay(ctx context.Context, pool *pgxpool.Pool, cl *kgo.Client) {
	for ctx.Err() == nil {
		rows, err := pool.Query(ctx, `SELECT id, key, payload FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT 100`)
		if err != nil {
			continue
		}
		var recs []*kgo.Record
		var ids []int64
		for rows.Next() {
			var id int64
			var key string
			var payload []byte
			if rows.Scan(&id, &key, &payload) == nil {
				recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: payload})
				ids = append(ids, id)
			}
		}
		rows.Close()
		if cl.ProduceSync(ctx, recs...).FirstErr() == nil {
			_, _ = pool.Exec(ctx, `UPDATE outbox SET sent_at = now() WHERE id = ANY($1)`, ids)
		}
	}
}

// consume records each event once in the inbox and commits the offsets after the transaction.
func consume(ctx context.Context, pool *pgxpool.Pool, cl *kgo.Client) {
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(r *kgo.Record) {
			_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1) ON CONFLICT DO NOTHING`, string(r.Key))
				return err
			})
		})
		_ = cl.CommitUncommittedOffsets(ctx)
	}
}
