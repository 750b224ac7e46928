// Command demo runs keiro-go end to end on one machine: two bounded contexts, "orders" and
// "billing", joined by Kafka.
//
//	orders:  command runner (event store) ─ hook ─▶ outbox ─▶ relay ─▶ Kafka
//	billing: Kafka ─▶ consumer ─▶ inbox + billing read model + payment saga + shipment
//	         workflow start (one transaction)
//	         payments (in-process) ─▶ payment saga ◀─ timer workers
//	         shipment workflow (reserve, ship) ◀─ workflow worker
//
// By default the Kafka broker is embedded (franz-go's kfake on a loopback port, printed so that
// `kcat -b` can attach) and PostgreSQL is the one at $DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable). The demo works in its own schema
// (--schema, default keiro_demo), which it drops and recreates at the start of every run.
//
// What it checks, and exits non-zero if any check fails:
//
//   - every order placed was published once by the relay (no outbox row left pending);
//   - every published order was applied exactly once to the billing read model, although the
//     demo delivers some messages twice on purpose (--duplicates): the inbox suppresses them;
//   - per customer (the Kafka key), billing applied the orders in the order the orders context
//     committed them: each customer's sequence numbers 1, 2, 3, … with no gap or swap;
//   - no inbox row is left failed;
//   - every order's payment saga (an events.ProcessManager: two orders in three are paid, a
//     PaymentTimeout timer voids the others) ends in exactly one terminal state, its
//     settlement stream holds exactly its two events, and every payment timer fired;
//   - every order's shipment workflow (a durable workflow started in the inbox transaction)
//     completed, each of its two steps ran once, and its journal holds exactly two entries.
//
// Flags: -n orders, --brokers for a real Kafka, --avro (with --schema-registry, or an embedded
// registry) for Avro payloads in the Confluent wire format. `demo --help` lists them all.
package main
