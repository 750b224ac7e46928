// Command orders is a small, complete use of keiro-go's in-transaction layer: an orders
// aggregate run through the command runner, and the integration producer feeding the outbox
// that the relay publishes to Kafka.
//
//	go run ./examples/orders                      # against $DATABASE_URL
//	DATABASE_URL=postgres://... go run ./examples/orders -schema orders_demo
//
// It creates (migrates) its own schema, places, pays and cancels a few orders, lets the
// producer catch up, and prints the outbox rows waiting for the relay.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// DefaultDatabaseURL is used when $DATABASE_URL is unset.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func main() {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = DefaultDatabaseURL
	}
	schema := flag.String("schema", "orders_example", "PostgreSQL schema to create and use")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Order numbers unique per run, so the example can be run again on the same schema.
	first := time.Now().Unix() % 1_000_000 * 10
	cfg := Config{DatabaseURL: url, Schema: *schema, OrderIDs: []string{
		fmt.Sprint(first + 1), fmt.Sprint(first + 2), fmt.Sprint(first + 3)}}
	if err := Run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}
