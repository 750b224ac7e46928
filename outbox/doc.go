// Package outbox is keiro-go's transactional outbox: a service writes its integration events
// in its own PostgreSQL transaction, and a relay publishes them to Kafka, at least once and in
// order per key.
//
// # Usage
//
// A producer enqueues events in the transaction that writes its data:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
//			return err
//		}
//		_, err := outbox.EnqueueTx(ctx, tx, envelope.Event{
//			MessageID: "order-placed-" + id, Source: "ordering", Destination: "orders.v1", Key: &id,
//			EventType: "OrderPlaced", ContentType: envelope.ContentTypeJSON,
//			Payload: payload, OccurredAt: time.Now(),
//		})
//		return err
//	})
//
// The event commits or rolls back with the order; the relay sees it only after commit.
// [EnqueueTx] writes to the outbox the transaction's search_path resolves, else to schema
// "keiro"; [NewStore] names the schema instead ([Store.EnqueueTx]). Producers in other
// languages call the SQL function <schema>.enqueue, or insert into keiro_outbox: the database
// keeps each key's order whatever the client.
//
// A relay publishes the outbox. It runs as a sidecar (cmd/relay: `relay run`) or inside the
// service, with a Kafka client of its own built from [ProducerOpts]:
//
//	client, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers(brokers...))...)
//	if err != nil {
//		return err
//	}
//	relay, err := outbox.NewRelay(pool, client, outbox.RelayConfig{}) // schema "keiro"
//	if err != nil {
//		return err
//	}
//	return relay.Run(ctx) // publishes until ctx is cancelled, then shuts down cleanly
//
// Any number of relays may drain one outbox. An event Kafka refuses for good, or that keeps
// failing, is kept as a rejected or dead row for an operator: [Admin.ListDead] lists them and
// [Admin.Requeue] publishes them again (`relay dead list`, `relay dead requeue`, the
// console). [RelayConfig.Policy] chooses the ordering ([PerKeyHeadOfLine] by default). With
// [RelayConfig.Mode] set to [ModeLog] a relay follows a logical replication slot instead of
// claiming rows (package outbox/logrelay provides that engine). The package's examples run
// each of these paths.
//
// # Guarantees
//
//   - Atomic: an event is written in the producer's transaction and commits or rolls back
//     with it; the database, not the client, keeps each key's rows in commit order.
//   - At least once: a committed row is published until Kafka acknowledges it, unless it is
//     rejected as unpublishable or exhausts MaxAttempts (then it is kept as 'rejected' or 'dead'
//     for operators: [Admin.ListDead], [Admin.Requeue]).
//   - Duplicates on Kafka only for rows whose produce was in flight when their relay died, was
//     paused past its lease, or was shut down past ShutdownTimeout. Consumers deduplicate by
//     message id (the inbox does).
//   - Exactly once with [RelayConfig.ExactlyOnce], for read_committed readers: in claim mode a
//     relay publishes its batches in Kafka transactions, each recording in the offsets topic
//     which claims (tokens and rows) it committed, and marks the rows sent only after the
//     commit; a claim lost with its relay is settled by another exactly-once relay, which
//     fences the lost relay's transactional id (recorded on the rows, claim_txn), reads what it
//     committed, marks those rows sent and releases the rest, instead of re-claiming them. A
//     relay without ExactlyOnce on the same schema re-claims such rows as it always did: mixing
//     the two gives at least once.
//   - Per (source, key) order under PerKeyHeadOfLine (the default), with any number of relays: a
//     row is claimed only when every earlier non-terminal row of its key is claimed in the same
//     statement, so a key is in at most one batch at a time; inside a batch the records of a
//     key go to one partition in order, and because the relay buffers a whole batch before
//     flushing, a failed produce request fails every later record of its partition (franz-go
//     keeps the idempotent sequence intact) — a later record of a key never reaches Kafka after
//     an earlier one failed. A key's rows for different destinations never share a flush (two
//     topics' requests succeed or fail independently): a row for another destination waits for
//     the flush of the rows before it. Rows without a key are unordered.
//
// # Enqueue
//
// [Store.EnqueueTx] validates the events and writes them in the caller's transaction, in one
// statement. Rows are visible to the relay only after commit; a rollback leaves nothing.
// Enqueuing is idempotent on (source, message id): identical content is a Duplicate, different
// content an identity Conflict (an error wrapping [ErrIdentityConflict], naming the differing
// field classes; roll back). The trace context of the caller's span is stored on the row when
// the event carries none, so the relay's send span continues the business transaction's trace.
// A sleeping relay is woken at commit (see "Wake-ups" below); [StoreOptions].DisableNotify turns
// that off, and [Store.Notify] wakes relays after commit.
//
// [Store.EmitTx] is an opt-in for a schema in log mode: it writes each event as a transactional
// logical decoding message instead of a row, which the log-mode relay publishes exactly as a row,
// in commit order with them. It is the cheapest enqueue, and it gives up duplicate detection
// (a retried transaction publishes twice), any copy outside the WAL until the slot confirms the
// event (a lost slot loses it; nothing lists it), and claim mode: on a schema in claim mode, or
// at REPEATABLE READ or SERIALIZABLE, it emits nothing and returns an error
// ([ErrEmitNeedsLogMode], [ErrEmitIsolation]).
//
// # Relay
//
// A relay claims batches (BatchSize rows, one statement, FOR UPDATE SKIP LOCKED) in seq order,
// moving them to 'publishing' with a fresh claim token and a lease; produces them with its own
// franz-go client (built with [ProducerOpts]: acks=all, idempotent, manual flushing); and marks
// every row of the batch in one statement fenced by the claim token, so a mark that arrives
// after the row was re-claimed changes nothing. Up to MaxInFlightBatches batches overlap
// (claiming, producing and marking run concurrently). It wakes on LISTEN/NOTIFY (a dedicated
// connection, reconnected with backoff) and polls every PollInterval (PollOnly for PgBouncer in
// transaction mode). Any number of relays may drain one table.
//
// A row whose lease expires while 'publishing' (its relay died or lost PostgreSQL: a live relay
// renews the leases of its batches in flight) is claimable again by any relay; the attempt it
// used stays counted. On a row's last attempt it counts only if the attempt ran: the relay
// records that a last attempt's produce starts (the row's produce_started column), and
// a row re-claimed after such a start goes 'dead' ("lease expired after final attempt", followed
// by the previous attempt's error if there was one); one whose produce never started (a claim
// whose reply was lost, a relay stopped before its flush) is claimed for that attempt again.
//
// A relay does not publish a batch whose lease, as last confirmed by PostgreSQL and timed on the
// relay's monotonic clock, has less than a quarter left, or that a renewal found taken over: it
// releases the rows instead (a relay paused or cut off from PostgreSQL past its lease would
// otherwise publish stale copies after the relay that re-claimed them).
//
// # Several relays
//
// Relays on one outbox split a deep backlog instead of racing over its front. The rows fall
// into 64 claim shares by a hash of their (source, key) (of the source under PerSourceStream;
// null-key rows, and every row under BestEffort, by seq), computed in the claim. The relays
// that publish the same Destinations form a share group: each holds, on a session of its own,
// the group's member lock shared and about 64/N of the share locks (advisory locks: N is the
// number of members), and rebalances every PollInterval (at most a second): a relay that
// stops, dies or loses its session loses its locks, and the others take its shares. While
// claims come back full, a relay claims from its own shares first; when they are drained it
// claims from every share (a dead relay's rows, the tail of a drain). In a trickle, and for a
// relay alone in its group, the claim is unrestricted, as for one relay. Shares are a
// preference, never a fence: order and leases rest on the claim alone (head of line, SKIP
// LOCKED, tokens, leases), so a share changing hands is safe. PollOnly relays take no shares.
// [Stats] reports the shares held (Shares, ShareMembers, ShareClaims).
//
// # Ordering policies
//
// [PerKeyHeadOfLine] (default), [PerSourceStream] (every row of a source, null keys included,
// in commit order for sources declared with [Admin.DeclarePerSourceOrder]; Kafka orders only
// within a partition, so a total order needs a single-partition topic),
// [StopTheLine] (claims like per-key, one batch in flight, publishes row by row; the first
// failure halts: no later row of the batch is sent, and Run returns an error wrapping
// [ErrHalted] naming the row — restart the relay after review) and [BestEffort] (no order: a failure affects only its own row).
// After a failure in a group (a key, a source, or the whole StopTheLine batch), later rows of the
// group that Kafka did not acknowledge are "skipped": back to 'failed' with their attempt
// refunded, due at once (still blocked behind the failed row). Rows Kafka did acknowledge are
// marked sent: re-sending them would only add duplicates.
//
// # Order at enqueue
//
// Per-key order across concurrent producers: keiro orders by a value assigned at insert, so two
// transactions enqueuing the same key concurrently could commit in the opposite order. The
// outbox's BEFORE INSERT trigger (migration "outbox_order") prevents it for every writer,
// whatever its client (EnqueueTx, the SQL function <schema>.enqueue, a plain INSERT): it takes a
// transaction-scoped advisory lock per keyed (source, key)
// (pg_advisory_xact_lock(hashtextextended(schema‖source‖key))) and only then draws seq, so
// same-key producers serialise and seq order is commit order for every key. EnqueueTx takes a
// call's several keys' locks first, in sorted order, so its calls never deadlock. A hash
// collision only serialises two unrelated keys. A source declared with
// [Admin.DeclarePerSourceOrder] takes one lock per source instead (null keys included), which
// is what makes [PerSourceStream] publish its rows in commit order.
//
// # Wake-ups
//
// A sleeping relay is woken by a NOTIFY on "<schema>.keiro_outbox", which PostgreSQL delivers
// at commit. A NOTIFY holds a database-wide lock from commit to WAL flush, so committers that
// notify queue up: EnqueueTx notifies only while a relay sleeps. A relay about to sleep holds an
// advisory lock (the sleep lock) that producers try to take shared; a producer that took it did
// not notify, and the relay cannot take it until that producer's transaction ends, so it claims
// the row before it sleeps (docs/architecture.md, "Wake-ups").
//
// # Failures
//
//   - Transient (for example UNKNOWN_TOPIC_OR_PARTITION once franz-go gives up, or an
//     unclassified error): 'failed', attempt used, retried after a capped exponential backoff
//     with equal jitter (d/2..d); 'dead' once MaxAttempts attempts are used. A topic created
//     late therefore loses nothing; one that never appears ends dead and can be requeued.
//   - Outage (retriable Kafka errors such as NOT_LEADER_FOR_PARTITION after franz-go's own
//     retries, request or delivery timeouts, connection errors, CLUSTER_AUTHORIZATION_FAILED):
//     'failed' WITHOUT using an attempt, retried after a relay-wide backoff that grows with the
//     outage and resets at the first success. An outage of any length kills no row; MaxAttempts
//     only bounds rows that Kafka keeps refusing.
//   - Permanent (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_TOPIC_EXCEPTION,
//     TOPIC_AUTHORIZATION_FAILED, INVALID_RECORD, CORRUPT_MESSAGE,
//     UNSUPPORTED_FOR_MESSAGE_FORMAT, POLICY_VIOLATION, and any record larger than
//     MaxRecordBytes / the client's ProducerBatchMaxBytes, detected before producing):
//     terminal 'rejected' at once with rejection_code (the Kafka error name in lowercase) and a
//     readable last_error. A rejection does not block its key. Kafka refuses a whole request for
//     one oversized record, so a record-level refusal of a record that shared its partition's
//     request with others is first retried alone (the bystanders are retried normally) and
//     rejected only if it fails alone.
//
// # Shutdown
//
// When Run's context is cancelled the relay stops claiming, waits up to ShutdownTimeout for
// in-flight produces, marks what finished, releases rows still without an outcome back to
// 'pending' with their attempt refunded, and returns nil.
//
// # Maintenance
//
// One relay per schema at a time (a session advisory lock) deletes sent rows older than
// Retention, RetentionBatch rows per statement, and samples the backlog, oldest-pending-age and
// dead gauges, every MaintenanceInterval. Dead and rejected rows are never deleted.
//
// # Deep backlogs
//
// A published row leaves dead entries in the outbox's partial indexes, in front of its key's
// head, until a vacuum removes them; a claim's descent to each head steps over them. The claims
// look each key's rows up from its head on, so a key's dead entries are stepped over once per
// claim, not once per lookup; and while the backlog is deep, once the table holds
// VacuumThreshold dead row versions (or as many rows inserted since its last vacuum), the
// relay vacuums and analyzes it itself (VACUUM (SKIP_LOCKED): one relay or autovacuum at a time, no reads or
// writes blocked), rather than wait for autovacuum, which comes at most once a minute and, by
// default, after a fifth of the table has died. A deep backlog over few keys (the table a Kafka
// outage leaves) then drains at the rate of a shallow one. Vacuuming needs the relay's role to
// own the table; a relay that does not logs so once and leaves the table to autovacuum (see
// docs/operations.md, "Deep backlogs").
//
// # Telemetry
//
// Metrics (scope "keiro"; docs/observability.md): keiro.outbox.enqueued {source, outcome},
// keiro.outbox.published, .retried, .deadlettered, .rejected, .order_broken
// {messaging.destination.name}, keiro.outbox.reclaimed, gauges keiro.outbox.backlog,
// keiro.outbox.oldest_pending.age, keiro.outbox.dead {messaging.destination.name}, histograms
// keiro.outbox.publish.latency (row creation → broker ack) and keiro.outbox.batch.size, and
// the messaging semantic conventions' messaging.client.sent.messages and
// messaging.client.operation.duration per produced record. One
// producer span "send <topic>" per record, child of the trace context stored on the row; the
// record's traceparent carries the send span when it is recording, else the stored context.
//
// The claim relies on PostgreSQL's statistics (autovacuum) for its plan; a freshly bulk-loaded
// table is claimed correctly but more slowly until it is analyzed.
package outbox
