// Command relay is keiro's outbox relay: it publishes the rows of the PostgreSQL outbox table to
// Kafka, at least once and in order per (source, key), and gives operators commands to migrate
// the schema, inspect the outbox and requeue dead rows. See docs/relay.md.
package main

import "github.com/keiro-go/keiro/cmd/internal/sidecar"

func main() { sidecar.Main(run) }
