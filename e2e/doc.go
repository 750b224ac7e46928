// Package e2e holds keiro-go's process-level tests; it has no non-test code.
//
// The tests build cmd/relay and cmd/consumer once (TestMain) and run them as operating-system
// processes against the real PostgreSQL (KEIRO_TEST_DATABASE_URL), a kfake broker or a real
// Apache Kafka, and the real schema registry (Apicurio Registry's Confluent API, started once per
// test binary; testenv.NewSchemaRegistry):
//
//   - TestPipeline*: outbox rows enqueued in PostgreSQL travel through the relay binary, Kafka and
//     the consumer binary into effects written by a PostgreSQL function in the inbox transaction
//     (JSON and Avro payloads).
//   - TestChaos: three relays and two consumers are SIGKILLed and restarted about every second
//     while producers enqueue 20k+ events over many keys and the broker fails for short spells.
//     At the end every committed event's effect is applied exactly once, in per-key order, and
//     no outbox or inbox row is left in a non-terminal state. KEIRO_CHAOS_DURATION lengthens it
//     (`make chaos`); KEIRO_CHAOS_EVENTS sets the number of events. It runs on kfake and on a
//     real broker in claim mode, and on a real broker in log mode (TestChaos/log: the relays
//     are active–standby on the schema's replication slot, and every keiro_outbox_log row's
//     message must reach the effects). TestChaos/kafka-eos and TestChaos/log-eos run the same
//     with --exactly-once: the committed records (read_committed) hold each event once.
//   - TestExactlyOnceThreeBrokers: 20k events over 200 keys published with --exactly-once to a
//     real three-broker cluster, in claim and in log mode, while the publishing relay is
//     SIGKILLed, frozen past its lease (a zombie continued after its successor took over) and
//     the partitions' leader broker is SIGKILLed. A read_committed reader of ours (franz-go)
//     and librdkafka's (Python binding) read each event exactly once, in per-key order.
//   - TestExactlyOnceZombie: a relay stopped with a Kafka transaction open is continued after
//     its successor took its claims or its slot over: it reports being fenced, and nothing it
//     produced is visible to a read_committed reader.
//   - TestForwardKilled: consume → produce through both sidecars. The consumer binary reads
//     topic A and its sql-mode function enqueues one outbox event per consumed event in the
//     inbox transaction; the relay binary publishes them to topic B. The consumer, the relay
//     or both are SIGKILLed and restarted while 2,000 events flow. The outbox ends with exactly
//     one row per consumed message, and B, read committed, holds each one's event exactly
//     once in key order (keirotest.RequireExactlyOnce): the relay runs with --exactly-once.
//   - TestLogModePostgresRestart: a log-mode relay follows a PostgreSQL cluster of the test's
//     own (initdb into a temporary directory, a free port) that is restarted with
//     `pg_ctl restart -m fast` and then crashed (`-m immediate`) while a producer enqueues; the
//     relay reconnects and replays from the confirmed position, and every committed event
//     reaches the topic in per-key commit order.
//   - TestInterop*: kcat and librdkafka's Python binding (Debian's python3-confluent-kafka, run by
//     /usr/bin/python3) read what the relay published and produce records our consumer applies.
//   - TestAdversarial*: every boundary where outside bytes enter, fed generated bad inputs
//     (adversarial_gen_test.go; KEIRO_ADVERSARIAL_N cases per boundary, from KEIRO_ADVERSARIAL_SEED,
//     `make fuzz` for many) each followed by a good item on its key or partition: outbox rows
//     written by plain SQL in claim and log mode, Kafka records through the consumer's go, sql,
//     http (each format) and Avro paths, and dead-letter produces that fail. The bad item ends
//     visible with its reason (a dead or rejected row, a dead letter with keiro-dlq-reason, a
//     refusal), the good one is delivered once, and nothing else is lost, reordered or
//     duplicated.
//
// What is guaranteed is what the tests assert: see docs/reliability.md for the chaos figures.
package e2e
