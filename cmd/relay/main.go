// Command relay is keiro's outbox relay: it publishes the rows of the PostgreSQL outbox table to
// Kafka, at least once and in order per (source, key), and gives operators commands to migrate
// the schema, inspect the outbox and requeue dead rows. See docs/relay.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/keiro-go/keiro/cmd/internal/gctune"
)

func main() {
	gctune.Apply()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
