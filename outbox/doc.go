// Package outbox is keiro-go's transactional outbox: integration events written in the
// producer's own PostgreSQL transaction (EnqueueTx) and published to Kafka by a relay (Relay)
// that runs as a sidecar or inside the service.
//
// # Enqueue
//
// [Store.EnqueueTx] writes events in the caller's transaction, in one round trip. Rows are
// visible to the relay only after commit; a rollback leaves nothing. Enqueuing is idempotent on
// (source, message id): identical content is a Duplicate, different content an identity
// Conflict (error [ErrIdentityConflict]; roll back). The trace context of the caller's span is
// stored on the row so the relay's send span continues the business transaction's trace.
//
// Per-key order across concurrent producers: keiro orders by a column assigned at insert, so
// two transactions enqueuing the same key concurrently could commit in the opposite order. By
// default EnqueueTx takes a transaction-scoped advisory lock per distinct keyed (source, key)
// (pg_advisory_xact_lock on hashtextextended(schema, source, key), in sorted order, in the
// same statement as the insert), so same-key producers serialise and seq order equals commit
// order for every key. Producers that already serialise same-key writes can opt out with
// StoreOptions.DisableKeyLocks. Hash collisions only serialise unrelated keys, never reorder.
//
// # Guarantees
//
//   - At least once: a committed row is published until Kafka acknowledges it (or it is
//     rejected as permanently unpublishable, or it exhausts its attempts and goes dead).
//   - Duplicates on Kafka only for rows whose produce was in flight when a relay died, lost its
//     lease, or failed after the broker had written the record; consumers deduplicate by
//     message id (the inbox does).
//   - Per (source, key) order under the default policy, with any number of relays on one table:
//     a key's row is claimable only when every earlier non-terminal row of the key is being
//     claimed in the same statement; the relay never lets a later same-key record reach Kafka
//     after an earlier one failed.
package outbox
