// Package events is keiro-go's in-transaction layer: an event store in PostgreSQL, a generic
// command runner, projections (inline and asynchronous) and the integration producer that
// feeds the outbox.
//
// # Event store
//
// [Store.AppendTx] appends to a stream ("<category>-<id>", for example "order-42") inside the
// caller's transaction, under an expected version ([Any], [NoStream], [StreamExists],
// [Exact]). A mismatch returns a *[WrongExpectedVersionError] and writes nothing. Events get a
// stream version (contiguous from 1) and a global position (increasing in append order, with
// holes where a transaction rolled back). Caller-chosen event ids are idempotent: the same id
// with the same content is a no-op success (AppendResult.Duplicate), different content is
// [ErrEventIDConflict]. Reads ([Store.ReadStream], [Store.ReadAll], [Store.ReadCategory]) are
// iterators that fetch one page per round trip; nothing loads a whole stream or log into memory.
//
// # Command runner
//
// A [Decider] (Initial, Decide, Evolve) plus a [Codec] make a [Runner]. [Runner.Run] hydrates
// the state (from an advisory snapshot when one is usable), decides, and appends at the
// hydrated version in one transaction together with the configured [Hook]s — inline
// projections and outbox enqueues belong there, so they commit with the events or not at all.
// Conflicts are retried with jittered exponential backoff and end in *[RetryExhaustedError].
// Snapshots are written after commit and never fail a committed command.
//
// # Subscriptions and projections
//
// A [Subscription] delivers the log (or one category) in global-position order. The handler
// runs in the same transaction that advances the checkpoint, so database projections are
// exactly-once: a crash or cancellation at any point leaves either the batch and its
// checkpoint, or neither. Only one Run per subscription name is active across processes (a
// session advisory lock); others wait as standbys. Appends NOTIFY at commit and subscriptions
// LISTEN, with polling as the fallback. [Subscription.Rebuild] resets the checkpoint and runs a
// truncate hook in one transaction; [Subscription.RebuildShadow] rebuilds into shadow tables
// and swaps them in one transaction, so readers never see a partial model.
//
// A failing handler does not stop the subscription: the event is delivered again, on its own,
// up to [RetryPolicy].MaxDeliveries times with backoff, then recorded as a [DeadLetter] in the
// transaction that moves the checkpoint past it ([PoisonHalt] stops instead, for strict order).
// [Store.ListDeadLetters] lists them; [Store.RequestReplay] has the running subscription
// deliver them again once the handler is fixed.
//
// No event is ever skipped: a global position is drawn from a sequence when a transaction
// inserts, so a reader can see position 11 committed while position 10's transaction is still
// running. A subscription therefore only reads up to positions it has proven final: it takes a
// "fence" (the newest visible position H and the transactions then writing to this store's
// events table) and reads up to H only once those writers have ended — every transaction that
// drew a position ≤ H had ended or was one of them. Transactions elsewhere (other schemas,
// other databases) never hold it back. docs/architecture.md has the proof.
//
// # Sharded subscriptions
//
// A [ShardedSubscription] splits a subscription into buckets by stream so that several
// workers share it: each bucket is leased by one worker at a time and has its own checkpoint,
// written in the handler's transaction only while the lease is unexpired (a worker whose lease
// ran out mid-batch rolls the batch back). Workers join and leave at any time and the buckets
// rebalance to a fair share; a worker sheds a bucket only between transactions; a dead
// worker's buckets move when its leases expire. Per-stream order, exactly-once database
// effects and the late-commit guard hold in every bucket.
//
// # Read models
//
// [ReadModels] is keiro's read-model registry (migration 017_read_models.sql): a [ReadModel] is
// registered at startup ([ReadModels.Register]: a live row if none exists, an existing row never
// overwritten) and queried with [ReadModels.Query] under a [Consistency]: [Eventual], [Strong]
// (the subscription has applied everything committed before the query started), [CategoryHead]
// or [PositionWait] (read your writes). A query is refused if the model is unregistered, its
// version or shape hash differs from the registry's, or it is not live, and a wait that times out
// returns a *[ReadModelWaitTimeoutError]. An [AsyncProjection] applied with [ReadModels.ApplyTx]
// (or as a subscription's [ReadModels.Handler]) runs at most once per event id and is fenced
// while its model is rebuilding; [ReadModels.StartRebuild] and [ReadModels.FinishRebuild] take a
// model offline, empty it and promote it again, refusing to promote a rebuild that applied
// nothing. docs/architecture.md, "Read models", has the state machine.
//
// # Routers, process managers and timers
//
// A [Router] turns an input (a private event from a subscription, an integration event from
// the inbox) into commands on target streams; a [ProcessManager] (a saga) keeps a state stream
// per correlation id and decides, with a pure Handle, the events, commands and timers of each
// step; a [TimerWorker] fires durable timers and delivers them back to their process manager.
// Every command runs through a target [Runner] with keiro's deterministic id
// ([RouterCommandID], [ProcessManagerCommandID]) as its first event's id, so a redelivered
// input applies nothing twice, and inside the input's transaction when it has one
// ([Router.EventHandler], [Router.InboxHandler]). [DispatchPolicy] is keiro's failure policy:
// undecodable inputs and rejected commands halt, are skipped, or are dead-lettered
// ([Store.ListDispatchDeadLetters]); transient failures are delivered again.
// docs/process-managers.md has a worked example.
//
// # Integration producer
//
// A [Producer] is a subscription that maps private events to integration events and enqueues
// them with outbox.Store.EnqueueTx in the checkpoint's transaction. Message ids are derived
// from (source, producer name, source event id, emission index) exactly as keiro does
// ([NewProducerIdentity]), and the outbox row id is the identity's UUIDv8. A replay skips the
// events at or below the producer's mark (the highest position it enqueued), so history is not
// published again even after the outbox's retention deleted the rows that made replays
// recognisable duplicates; ProducerConfig.Republish re-enqueues them, and then a mapper that
// changed history makes the batch roll back and Run stop with an error wrapping
// outbox.ErrIdentityConflict.
//
// All SQL addresses tables through the configured schema (migrations 003_events.sql,
// 006_events.sql, 010_timers.sql, 013_subscription_shards.sql and 017_read_models.sql), never
// search_path; a read model's own table is the application's, named by ReadModel.QualifiedTable.
package events
