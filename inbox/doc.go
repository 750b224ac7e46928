// Package inbox gives a Kafka consumer exactly-once effects in PostgreSQL: each message's
// handler runs in one transaction with a dedupe row, so a redelivered message never runs its
// effects twice.
//
// # Usage
//
// A bounded context consumes its topics with a [Handler] that writes its effects through the
// inbox transaction:
//
//	consumer, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{
//		Brokers: brokers, Group: "billing", Topics: []string{"orders.v1"},
//	}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
//		var order struct{ ID string }
//		if err := envelope.DecodeJSON(&ev, &order); err != nil {
//			return inbox.Permanent(err) // no retry can fix it: dead-letter it now
//		}
//		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, order.ID)
//		return err // any other error is retried, then dead-lettered
//	})
//	if err != nil {
//		return err
//	}
//	return consumer.Run(ctx) // until ctx is cancelled; offsets commit after the transactions
//
// The handler's writes and the message's inbox row (in schema "keiro" by default,
// ConsumerConfig.Store.Schema) commit together; a redelivery finds the row and skips the
// handler. Records are processed in batches of up to BatchSize in one transaction, with the
// guarantees of one record at a time. A message that fails MaxAttempts times, or at once with
// [Permanent], goes to the dead-letter topic ("{topic}.dlq") and stays in the inbox for an
// operator ([Admin.ListFailed], [Admin.Reprocess]; `consumer inbox failed list|retry`, the
// console). cmd/consumer runs the same consumer as a sidecar, with handlers that call an HTTP
// endpoint of the service or a PostgreSQL function.
//
// Deliveries that do not come from the consumer (another transport, a replay) go through
// [Store.Process] or [Store.ProcessBatch] with the same guarantees. The package's examples
// run each of these paths.
//
// # Guarantees
//
//   - Idempotent receive within the retention window. The inbox row keyed by
//     (consumer, source, dedupe key) and the handler's writes commit in one transaction
//     ([Store.Process]). The row is inserted first, under the primary key, so two deliveries
//     racing in two processes serialise on the key: the second waits for the first to commit
//     and classifies as [Duplicate] without running the handler.
//   - The consumer name is part of the key: two bounded contexts sharing a database never
//     deduplicate each other's messages (keiro keyed by source only).
//   - Failures are explicit. A handler error, a panic, an SQL error that aborted the
//     transaction although the handler returned nil ([ErrTxAborted]), or a handler that rolled
//     back the transaction ([ErrHandlerRolledBack]) all roll back the effects and record a
//     failed attempt in a separate transaction with the full envelope. After
//     StoreConfig.MaxAttempts attempts, or at once for a [Permanent] error, the message is
//     [Poisoned]; later deliveries classify as [PreviouslyFailed] and never run it again
//     until an operator resets it ([Admin.RetryFailed]) or re-runs it ([Admin.Reprocess]).
//   - The dedupe window is the retention of completed rows ([Store.DeleteCompleted],
//     [DefaultRetention] = 7 days): a message redelivered after its row was deleted is
//     processed again. Failed rows are never deleted by retention.
//   - Exactly-once is promised for the effects written through the handler's transaction
//     only. Calls to other systems from a handler happen at least once; keep them idempotent.
//
// # Consumer runner
//
// [Consumer] reads Kafka in a consumer group with auto-commit off, processes each partition
// in order (partitions in parallel, bounded) through the Store, and commits an offset only
// after the record's inbox transaction committed or the record was dead-lettered (produce
// acknowledged). Undecodable records and poisoned messages go to the dead-letter topic with
// the original key, value and headers plus keiro-dlq-* headers; nothing is dropped. Handler
// failures below the ceiling are retried in place with backoff (the partition waits, which
// keeps per-key order). Database outages are retried with backoff and never dead-letter.
// On partition revocation and on shutdown, in-flight work finishes and its offsets are
// committed before the partitions are released.
//
// # Decisions
//
//   - Attempt ceiling: [DefaultMaxAttempts] = 5 failed attempts, retried in place with capped
//     exponential backoff and equal jitter ([DefaultRetryInitial] 100ms doubling to
//     [DefaultRetryMax] 10s, each delay drawn from its upper half), so a poison message holds
//     its partition for 0.75 to 1.5s before it is dead-lettered. A failed attempt is counted only when the message is at fault: a
//     lost database connection is an outage, retried without limit and never dead-lettered;
//     so is a handler error marked with [Outage] (the HTTP handler's unreachable or overloaded
//     target, the SQL handler's missing function), whose RetryAfter is the least wait; and
//     contention ([IsContention]: SQLSTATE class 40, 55P03) is retried without using an
//     attempt up to ConsumerConfig.MaxContentionRetries (50) times, then counts as ordinary
//     failures. [Store.Process] reports those as [Deferred].
//   - Dead-letter topic: one per source topic, [DefaultDeadLetterTopic] = "{topic}.dlq"
//     (configurable, "{topic}" is substituted; a single fixed name is allowed). The original
//     key, value and headers are kept, and keiro-dlq-reason (decode | schema | dedupe |
//     poisoned | permanent), keiro-dlq-error, keiro-dlq-attempts, keiro-dlq-topic,
//     keiro-dlq-partition, keiro-dlq-offset, keiro-dlq-consumer and keiro-dlq-at (RFC 3339)
//     are appended. A failing dead-letter produce is retried and the partition waits: a
//     record is never skipped.
//   - A poisoned row stays "failed" with poisoned=true. Redeliveries classify as
//     [PreviouslyFailed]; once the runner's dead-letter produce is acknowledged it records it
//     in the row (Result.DeadLettered), and later redeliveries count as duplicates instead of
//     being dead-lettered again (a runner stopped between the two dead-letters the message on
//     its next delivery). [Admin.RetryFailed] resets rows so that a
//     redelivery runs them again; since the runner already committed their offsets, the
//     operator command `consumer inbox failed retry` uses [Admin.Reprocess], which re-runs the
//     handler from the stored full envelope inside an inbox transaction.
//   - Group commit (the default, [DefaultBatchSize] 500): a partition's worker takes what is
//     buffered for it, up to BatchSize records, into one transaction ([Store.ProcessBatch];
//     with a [BatchHandler], [Store.ProcessBatchWith]) without waiting for more. If a handler
//     fails, the batch rolls back, the records before the failing one commit in a new
//     transaction, the failing one is retried in place under the rules of one record at a
//     time, and the records after it wait and form the next batch: per-partition (so per-key)
//     order of effects, exactly-once effects and offsets-after-commit hold under failures.
//     BatchSize 1 runs one record per transaction. (Store.ProcessBatch called directly goes on
//     past a failed record.)
//   - Rebalances: the client blocks a rebalance until the records of a poll are handed to
//     their partitions' workers, so records polled before a revocation never reach the worker
//     of a later assignment of the same partition ahead of its re-fetch.
//   - Back-pressure: each partition holds at most ConsumerConfig.MaxBufferedRecords records
//     and MaxBufferedBytes bytes (plus one poll: the consumer sizes its fetch requests by the
//     compression ratio it measures, so that a poll holds about the client's
//     FetchMaxPartitionBytes per partition decompressed), buffered or in progress: a batch
//     counts until
//     its transaction has ended, and a record counts its Go structures too. A full buffer
//     holds up the next poll while the other partitions have records to work on; when one of them runs dry, the full partitions' fetching is paused
//     (kgo.PauseFetchPartitions, which drops what the client already fetched for them) until
//     their workers have worked the backlog down to half, so a slow partition never holds up
//     the others, and a uniform backlog is fetched once. The consumer sets kgo.FetchMaxWait
//     to [DefaultFetchMaxWait] so a resumed partition is refetched promptly.
//   - Retention runs in every consumer instance, under a PostgreSQL advisory lock per
//     (schema, consumer) so only one deletes at a time, [DefaultDeleteBatch] rows per
//     statement.
package inbox
