// Command consumer is keiro's Kafka consumer sidecar: it reads integration events from Kafka in
// a consumer group, records each in the PostgreSQL inbox and hands it to a handler, so that a
// redelivered message never runs its effects twice. See docs/consumer.md.
//
// # Guarantees
//
//   - --handler=sql calls a PostgreSQL function inside the inbox transaction: its effects are
//     applied exactly once per (consumer, source, dedupe key) while the completed inbox row is
//     retained (--retention).
//   - --handler=http POSTs each event to a service: at-least-once, with an Idempotency-Key
//     header (<consumer>:<source>:<dedupe key>) that is the same on every redelivery, for the
//     service to dedupe.
//   - An offset is committed only after its record's inbox transaction committed or the record
//     was dead-lettered (--dlq-topic); per-partition order is kept.
//   - SIGTERM/SIGINT: /readyz turns 503, in-flight messages finish (bounded by
//     --shutdown-timeout), offsets are committed, the group is left, and the exit status is 0.
//   - Configuration comes from flags and KEIRO_CONSUMER_* variables; every problem is reported
//     at once (exit status 2) and secrets are never printed.
//
// Commands: run (the default), migrate, status, inbox failed list, inbox failed retry.
package main
