// Package keirotest is a test kit for services built on keiro-go: it lets a service's own
// tests check the whole path from the business transaction to the consumer's effect, with real
// storage and a real Kafka protocol, in the style of river's rivertest.
//
//   - [NewDB] (or [NewSchema] on a pool of your own) gives a test a fresh, migrated PostgreSQL
//     schema, dropped when the test ends.
//   - [NewKafka] starts an embedded Kafka broker (franz-go's kfake) on loopback, with a ready
//     client; [Kafka.FailProduces] makes it refuse produce requests for a while, so a service
//     can test what it does during a Kafka outage.
//   - [RequireEnqueued] and [RequireNotEnqueued] assert outbox rows, inside the caller's
//     transaction or after it committed; a row's status is an [outbox.Status]
//     ([outbox.StatusPending], [outbox.StatusSent], ...), and any other value fails the test.
//   - [DrainOutbox] runs a real relay until the outbox is empty and returns what it published.
//   - [RequirePublished] asserts records on a topic, keiro headers decoded.
//   - [RequireExactlyOnce] asserts that a topic's committed records hold each expected message
//     exactly once and each key's records in order, as a read_committed consumer sees them:
//     records of aborted Kafka transactions do not count ([CommittedRecords] returns them).
//   - [Deliver] hands an event to an inbox handler (a Go handler, a PostgreSQL function or an
//     HTTP endpoint) through a real inbox transaction, optionally twice to prove that the
//     duplicate is suppressed. A failing handler fails the test unless DeliverConfig.Want
//     names the failure the test expects.
//   - [RequireProcessed] and [RequireInboxFailed] assert a message's inbox row by message id;
//     its state is one of the [InboxStatus] constants ([InboxCompleted], ...).
//   - [RunConsumer] runs the service's real inbox consumer in the background for the test;
//     [Consumer.WaitProcessed] and [Consumer.WaitDeadLettered] wait for what it did to a
//     message. [Produce] writes an event as the relay publishes it, and [RequireDeadLettered]
//     asserts records on a dead-letter topic with their reason.
//   - Header matchers ([WithCorrelationID], [WithTraceID], [WithSchemaID], [WithHeader], ...)
//     check a record's headers in RequirePublished and RequireDeadLettered.
//   - [NewTx] runs a test in a transaction rolled back when it ends, for the fastest tests:
//     the assertions read through it.
//
// # Failures
//
// Every helper takes a [testing.TB] and reports problems through it with t.Fatalf: an
// assertion stops the test at its first failure and says what it expected and what it found
// (for RequireEnqueued, every row the outbox holds and how each differs). Setup helpers fail,
// never skip, when PostgreSQL is unreachable: a green run must mean the storage was exercised.
//
// # Parallel tests
//
// Each [NewDB] schema and each [NewKafka] broker belongs to one test, so tests using the kit
// may call t.Parallel. Assertions read only the schema or broker they are given.
//
// The environment (databases, the broker, produce failures) lives in package
// keirotest/testenv, which depends on no keiro component but the migrations so that keiro's
// own component tests can use it; this package re-exports all of it ([Kafka] is this
// package's handle of the environment's broker, with the same fields and methods).
//
// # Databases
//
// The database comes from KEIRO_TEST_DATABASE_URL, else DATABASE_URL, else
// [DefaultDatabaseURL]. Set KEIRO_TEST_KEEP_SCHEMA to keep test schemas for inspection.
package keirotest
