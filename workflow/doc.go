// Package workflow runs durable workflows on PostgreSQL, in the same database, and the same
// transactions, as the event store, the outbox, the inbox and the durable timers (keiro
// 0.2.0.0's Workflow family; its neighbours are DBOS Transact, Temporal and Restate).
//
// A workflow is an ordinary Go function registered by name ([Register]). Its side effects are
// steps ([Step]): each runs once per instance, in a transaction that also journals its result,
// so what a step writes through its transaction (rows, an outbox event, a started workflow)
// commits exactly once with the journal entry. A run that is interrupted — a crash, a lost
// lease, a suspension — is run again from the start, and every journaled step returns its
// recorded result without running: only the un-journaled tail does work.
//
// # Starting and running
//
// [Workflow.StartTx] inserts an instance in the caller's transaction (an HTTP handler's, an
// inbox handler's, another step's): it exists, and is runnable, only if that transaction
// commits, and a NOTIFY at commit wakes the workers. A [Worker] claims runnable instances under
// a lease (LeaseTTL; every journaled step extends it), runs them, and records the outcome:
// completed, suspended, retrying after a failure (Backoff, up to MaxAttempts failed runs in a
// row, progress resets the count), failed, cancelled or continued as new. Several workers, in
// one process or many, never run one instance at once while their leases live; an expired
// lease (a crashed worker) is taken over.
//
// # Waiting
//
// [Await] parks the run until [Engine.CompleteStepTx] records the awaited step; [Sleep] until a
// duration after the sleep first ran (a durable timer is armed with it); [AwaitAwakeable] until
// the outside world completes, fails or cancels an id from [NewAwakeable]; [AwaitChild] until a
// child started with [StartChild] ends. A parked instance costs nothing: workers skip it until
// a wake source (a completion, a timer, a child's end) makes it runnable, in the wake source's
// own transaction.
//
// # Long journals
//
// A run reads its generation's journal when it starts. For instances with long journals,
// Config.Snapshot ([SnapshotEvery], [SnapshotOnTerminal]) writes advisory snapshots of the
// step map after a step's commit; a run then reads the snapshot and the steps recorded after
// it. A snapshot never changes what a run does: a missing, incompatible or undecodable one
// means the whole journal is read, and a failed snapshot write never fails the step. Instances
// that run for ever should also use [ContinueAsNew], which bounds the journal itself.
//
// # Guarantees
//
//   - A step's transactional effects and its journal entry commit together, once per instance
//     and generation; two writers of one step agree on the first one's result.
//   - Effects outside a step's transaction (a call to another service) are at least once: a
//     crash between them and the step's commit runs them again. Make them idempotent (pass the
//     instance id and step name as an idempotency key).
//   - A workflow function must be deterministic in the order and names of its steps: the
//     journal is keyed by step name, and a run that reaches a step name finds its result.
//     Change a running workflow's shape behind [Patched].
//   - Completion, failure and cancellation are terminal: no later completion, timer or retry
//     resurrects an instance.
//
// See docs/workflows.md for the state machine and the mapping to keiro's test cases.
package workflow
