// Command consumer is keiro's Kafka consumer sidecar: it reads integration events from Kafka in
// a consumer group, records each in the PostgreSQL inbox and hands it to a handler (an HTTP
// endpoint or a PostgreSQL function), so that a redelivered message never runs its effects
// twice. See docs/consumer.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
