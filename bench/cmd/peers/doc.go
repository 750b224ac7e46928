// Command peers runs keiro-go's relay and consumer side by side with the peers users would pick
// instead, on the same machine, the same PostgreSQL and the same Kafka, and prints one table per
// scenario. The broker is chosen with -kafka: real (the default: Apache Kafka in KRaft mode,
// one node, started through keirotest/testenv/kafkabroker from Maven artifacts cached per
// machine), kfake (franz-go's in-process fake, in the parent) or brokers=host:port,… (a
// running cluster of the user's).
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
//   - claim and log (named in -contenders): keiro's claim relay under that name, and keiro's
//     log mode (RelayConfig{Mode: ModeLog}): the run switches its schema to log mode before
//     the events are written, so they go to keiro_outbox_log and the relay follows its slot;
//   - log-emit (named in -contenders): as log, but the events are written with Store.EmitTx
//     (logical decoding messages, no row), which the same relay decodes from its slot;
//   - debezium and debezium-tuned (named in -contenders): Debezium embedded (bench/debezium, a
//     Maven project built once, offline after the first resolution) on a slot and
//     publication of its own over keiro_outbox_log, the table whose rows are insert-only,
//     with its outbox event router mapped to keiro's columns and a Kafka producer with
//     acks=all and idempotence; once with the engine's documented defaults, once tuned;
//   - consumers: inbox.NewConsumer with a SQL handler (exactly once, durable) against
//     Watermill's Kafka subscriber with its Deduplicator middleware and the same SQL handler
//     (at least once; deduplication in memory only).
//
// Besides the contender's own CPU time and peak RSS, each relay run reports the CPU time, from
// the contender's "ready" to its stop, of the contender, of the PostgreSQL backends serving it
// (found by its sockets' ports in pg_stat_activity; /proc of the server's processes) and of
// the broker (-kafka real only), per delivered message; and the WAL per event its run's
// schema caused while the events were enqueued and while the contender ran (pg_walinspect
// when the server offers it; pg_current_wal_lsn deltas, cluster-wide, otherwise). The load
// average is printed beside every run.
//
// A broker the command starts is warmed before the first run (300 000 records written and read
// back, then a wait until the broker is idle), and each scenario starts with two unrecorded
// runs of every contender (-warmup-runs), then again a wait until the broker is idle: the
// broker's JIT compiles the paths each client's traffic takes over that traffic's first runs
// (the broker's CPU in a contender's first recorded run was 1.7–2× its second's after one
// warm-up run, the same after two), and that CPU is no contender's.
// PEERS_PRODUCE_STATS=1 prints the keiro relays' produce requests and record batches;
// PEERS_KGO=compression=…,batchmax=…,linger=… varies their producer (producerenv.go).
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
