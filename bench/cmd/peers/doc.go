// Command peers runs keiro-go's relay and consumer side by side with the peers users would pick
// instead, on the same machine, the same PostgreSQL and the same in-process Kafka (franz-go's
// kfake), and prints one table per scenario.
//
// Contenders (each run in its own subprocess — this binary re-executed with -child — so that
// its CPU seconds and peak RSS come from its own rusage):
//
//   - keiro: outbox.NewRelay with outbox.ProducerOpts and the default RelayConfig;
//   - watermill: Watermill's Forwarder (watermill-sql/v4 subscriber on the forwarder topic,
//     watermill-kafka/v3 Sarama SyncProducer publisher), once with the libraries' defaults and
//     once with the best honest tuning we found (batch 1000, 10 ms poll, newer protocol);
//   - skiplocked: the loop most teams write — claim N rows FOR UPDATE SKIP LOCKED, produce
//     them synchronously with franz-go, mark them sent, commit;
//   - consumers: inbox.NewConsumer with a SQL handler (exactly once, durable) against
//     Watermill's Kafka subscriber with its Deduplicator middleware and the same SQL handler
//     (at least once; deduplication in memory only).
//
// Scenarios: drain of pre-enqueued events (msgs/s from the child's "ready" to the last record
// seen on the topic) and a steady offered rate (enqueue→consumed latency p50/p99). Latency is
// measured by a franz-go consumer in the parent from the enqueue time written into each payload
// to the moment the record is read back from the broker: an upper bound of enqueue→ack that
// adds the same fetch hop to every contender.
//
// The guarantee each run gives is printed beside its row. The command is a benchmark tool, not
// a library: it is not imported by the main module and its figures depend on the machine.
package main
