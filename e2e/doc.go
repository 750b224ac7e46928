// Package e2e holds keiro-go's process-level tests; it has no non-test code.
//
// The tests build cmd/relay and cmd/consumer once (TestMain) and run them as operating-system
// processes against the real PostgreSQL (KEIRO_TEST_DATABASE_URL), a kfake broker and an srfake
// schema registry served by the test process on loopback ports:
//
//   - TestPipeline*: outbox rows enqueued in PostgreSQL travel through the relay binary, Kafka and
//     the consumer binary into effects written by a PostgreSQL function in the inbox transaction
//     (JSON and Avro payloads).
//   - TestChaos: three relays and two consumers are SIGKILLed and restarted about every second
//     while producers enqueue 20k+ events over many keys and the broker fails for short spells.
//     At the end every committed event's effect is applied exactly once, in per-key order, and
//     no outbox or inbox row is left in a non-terminal state. KEIRO_CHAOS_DURATION lengthens it
//     (`make chaos`); KEIRO_CHAOS_EVENTS sets the number of events.
//   - TestInterop*: kcat and librdkafka's Python binding (Debian's python3-confluent-kafka, run by
//     /usr/bin/python3) read what the relay published and produce records our consumer applies.
//
// What is guaranteed is what the tests assert: see docs/reliability.md for the chaos figures.
package e2e
