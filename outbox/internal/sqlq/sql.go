package sqlq

import (
	"github.com/keiro-go/keiro/internal/adminq"
	"github.com/keiro-go/keiro/internal/advisorylock"
)

// All of the outbox's SQL lives in this package. Every statement names its tables through the
// {{schema}} placeholder, replaced once by [New] with a schema name that
// migrations.ValidateSchema accepted, so no statement relies on search_path and none is built
// from user input at run time. The advisory lock keys come from locks.go through the
// {{…_lock}} placeholders, replaced in the same place.

// sqlEnqueue and sqlEnqueueLog insert one call's events in one statement, each in its mode:
// sqlEnqueue into keiro_outbox (claim mode), sqlEnqueueLog into keiro_outbox_log (log mode).
// Each reads the schema's mode itself (migration 009's keiro_outbox_settings, once per
// statement), inserts nothing when the schema is in the other mode (the test is a one-time
// filter, an uncorrelated sub-select), and ends with the mode row: a NULL id and 1 in log mode,
// 0 in claim mode. The Store runs the statement of the mode its last call found, and the other
// one, in the same transaction, when the mode row says the schema changed (Store.insert): a
// producer follows the mode without a redeploy, and pays one statement of the other mode once
// after a switch. An event already in the other mode's table is inserted nowhere and read back
// as a duplicate or a conflict (in claim mode the outbox's trigger sees to it, as for every
// other writer; in log mode sqlEnqueueLog's probe).
//
// Both statements take keiro_outbox's ROW EXCLUSIVE lock, which the mode switch's fence waits
// for and holds back (migration 009): sqlEnqueue as its insert target, sqlEnqueueLog through
// sqlLockOutbox, sent before it in the same round trip. Each statement's snapshot is taken
// after that lock, so it reads the mode the switch left.
//
// sqlEnqueue: the outbox's BEFORE INSERT trigger (migration "outbox_order") takes each row's
// (source, key) transaction-scoped advisory lock, or its declared source's lock, before it
// draws the row's seq, so same-key enqueuing transactions serialise and seq order equals commit
// order per key, for every writer. With $23 = true (a call with several keys) the locks CTE
// first takes the keys' locks in hash order, the same keys the trigger takes (it re-enters them
// at no wait), so two calls naming the same keys in different orders cannot deadlock; the
// INSERT reads the one-row locks CTE, so they are held before any row is inserted. With $24 =
// false (StoreOptions.DisableNotify) no NOTIFY is sent.
//
// {{input}} is the call's events: sqlEnqueueMany's arrays for several events, sqlEnqueueOne's
// scalars for one. Each array parameter is read through a scalar sub-select, (SELECT
// $n::type[]), so that the planner does not see the arrays' lengths in a custom plan: it then
// estimates every call's input alike, its custom plans cost what the generic plan costs, and
// PostgreSQL keeps the prepared statement's generic plan after five calls instead of planning
// every call again (0.4 ms, more than a single event's insert; BENCHMARKS.md note 14). A single
// event binds scalars: no arrays to decode, no unnest, a plan as short as a plain insert's.
const sqlEnqueue = `
WITH input AS (
    {{input}}
), mode AS (
    SELECT coalesce((SELECT s.mode = 'log' FROM {{schema}}.keiro_outbox_settings s), false) AS log
), locks AS (
    SELECT count(pg_advisory_xact_lock(h)) AS n FROM (
        SELECT DISTINCT {{key_lock}} AS h
        FROM input WHERE message_key IS NOT NULL AND $23::boolean
            AND NOT (SELECT log FROM mode)
        ORDER BY h
    ) k
), ins AS (
    INSERT INTO {{schema}}.keiro_outbox (outbox_id, message_id, source, destination, message_key,
        event_type, schema_version, content_type, schema_registry, schema_subject,
        schema_version_ref, schema_id, schema_fingerprint, source_event_id,
        source_global_position, causation_id, correlation_id, traceparent, tracestate,
        payload_bytes, attributes, occurred_at)
    SELECT i.outbox_id, i.message_id, i.source, i.destination, i.message_key, i.event_type,
        i.schema_version, i.content_type, i.schema_registry, i.schema_subject,
        i.schema_version_ref, i.schema_id, i.schema_fingerprint, i.source_event_id,
        i.source_global_position, i.causation_id, i.correlation_id, i.traceparent, i.tracestate,
        i.payload_bytes, i.attributes::jsonb, i.occurred_at
    FROM input i CROSS JOIN locks
    WHERE locks.n >= 0 AND NOT (SELECT log FROM mode)
    ORDER BY i.ord
    ON CONFLICT (source, message_id) DO NOTHING
    RETURNING outbox_id
), notified AS (
    SELECT pg_notify('{{schema}}.keiro_outbox', '')
    FROM (SELECT 1 AS one FROM ins WHERE $24::boolean LIMIT 1) x
    WHERE x.one = 1 AND (NOT pg_try_advisory_xact_lock_shared({{sleep_lock_all}})
                         OR NOT pg_try_advisory_xact_lock_shared({{sleep_lock_filtered}}))
)
SELECT outbox_id, (SELECT count(*) FROM notified) FROM ins
UNION ALL
SELECT NULL, log::int FROM mode`

// sqlEnqueueLog is log mode's statement (see sqlEnqueue): the rows go straight to
// keiro_outbox_log with no key lock, since the slot publishes in commit order. It names
// keiro_outbox only in its probe for an event already there (an ACCESS SHARE lock), so the
// caller sends sqlLockOutbox before it. Naming keiro_outbox as an insert target that inserts
// nothing would cost a quarter of a single event's statement (the insert's result relation,
// its five indexes and trigger are set up at every execution): BENCHMARKS.md, note 14. A row
// lock on the probe (ROW SHARE, with a fence of EXCLUSIVE) would cost no statement, but needs
// the UPDATE privilege on keiro_outbox, which a producer's role need not have.
const sqlEnqueueLog = `
WITH mode AS (
    SELECT coalesce((SELECT s.mode = 'log' FROM {{schema}}.keiro_outbox_settings s), false) AS log
), ins_log AS (
    INSERT INTO {{schema}}.keiro_outbox_log (outbox_id, message_id, source, destination,
        message_key, event_type, schema_version, content_type, schema_registry, schema_subject,
        schema_version_ref, schema_id, schema_fingerprint, source_event_id,
        source_global_position, causation_id, correlation_id, traceparent, tracestate,
        payload_bytes, attributes, occurred_at)
    SELECT i.outbox_id, i.message_id, i.source, i.destination, i.message_key, i.event_type,
        i.schema_version, i.content_type, i.schema_registry, i.schema_subject,
        i.schema_version_ref, i.schema_id, i.schema_fingerprint, i.source_event_id,
        i.source_global_position, i.causation_id, i.correlation_id, i.traceparent, i.tracestate,
        i.payload_bytes, i.attributes::jsonb, i.occurred_at
    FROM ({{input}}) i
    WHERE (SELECT log FROM mode)
        AND NOT EXISTS (SELECT 1 FROM {{schema}}.keiro_outbox o
                        WHERE o.source = i.source AND o.message_id = i.message_id)
    ORDER BY i.ord
    ON CONFLICT (source, message_id) DO NOTHING
    RETURNING outbox_id
)
SELECT outbox_id, 0 FROM ins_log
UNION ALL
SELECT NULL, log::int FROM mode`

// sqlEmitOne and sqlEmitMany write Store.EmitTx's events as transactional logical decoding
// messages of prefix $1 (logmsg), one message per event, in the caller's order: sqlEmitOne the
// content $2, sqlEmitMany the contents cut from one bytea $2 by the spans $3 (each the offset
// shifted left by 32 bits plus the length, as sqlEnqueueMany's payloads). Both are sent after
// sqlLockOutbox, in the same round trip, so that the mode switch's fence holds them back as it
// holds back EnqueueTx, and each reads the mode the switch left. They emit only when the schema
// is in log mode and the transaction is at READ COMMITTED (its statement's snapshot is taken
// after the lock; an older snapshot could read the mode from before a switch back to claim and
// emit events that no relay reads), and answer one row: the mode is log, the isolation is read
// committed, and the number of messages written.
const (
	sqlEmitOne = `
WITH m AS (SELECT coalesce((SELECT s.mode = 'log' FROM {{schema}}.keiro_outbox_settings s), false) AS log,
    current_setting('transaction_isolation') = 'read committed' AS rc)
SELECT m.log, m.rc, CASE WHEN m.log AND m.rc
    THEN (pg_logical_emit_message(true, $1::text, $2::bytea) IS NOT NULL)::int ELSE 0 END
FROM m`
	sqlEmitMany = `
WITH m AS (SELECT coalesce((SELECT s.mode = 'log' FROM {{schema}}.keiro_outbox_settings s), false) AS log,
    current_setting('transaction_isolation') = 'read committed' AS rc)
SELECT m.log, m.rc, (SELECT count(pg_logical_emit_message(true, $1::text,
        substring((SELECT $2::bytea) FROM (u.span >> 32)::int + 1 FOR (u.span & 4294967295)::int)))
    FROM unnest((SELECT $3::int8[])) AS u(span)
    WHERE m.log AND m.rc)
FROM m`
)

// sqlLockOutbox is what log mode's enqueue statement is sent after (see sqlEnqueueLog).
const sqlLockOutbox = `LOCK TABLE {{schema}}.keiro_outbox IN ROW EXCLUSIVE MODE`

// sqlEnqueueMany is sqlEnqueue's input of several events: $1..$22 are the columns' arrays,
// but for the payloads: {{payloads}} is every payload, one after the other, in one bytea, and
// $20 their spans in it, each the offset shifted left by 32 bits plus the length. One bytea
// parameter is encoded by the client in one copy; a bytea[] of a thousand 1 KiB payloads was
// appended element by element into a buffer that grew a copy at a time, a fifth of the
// statement's time (BENCHMARKS.md, note 13).
const sqlEnqueueMany = `SELECT t.outbox_id, t.message_id, t.source, t.destination, t.message_key, t.event_type,
        t.schema_version, t.content_type, t.schema_registry, t.schema_subject, t.schema_version_ref,
        t.schema_id, t.schema_fingerprint, t.source_event_id, t.source_global_position,
        t.causation_id, t.correlation_id, t.traceparent, t.tracestate,
        substring((SELECT {{payloads}}::bytea) FROM (t.span >> 32)::int + 1 FOR (t.span & 4294967295)::int)
            AS payload_bytes,
        t.attributes, t.occurred_at, t.ord
    FROM unnest(
        (SELECT $1::uuid[]), (SELECT $2::text[]), (SELECT $3::text[]), (SELECT $4::text[]),
        (SELECT $5::text[]), (SELECT $6::text[]), (SELECT $7::bigint[]), (SELECT $8::text[]),
        (SELECT $9::text[]), (SELECT $10::text[]), (SELECT $11::bigint[]), (SELECT $12::bigint[]),
        (SELECT $13::text[]), (SELECT $14::uuid[]), (SELECT $15::bigint[]), (SELECT $16::uuid[]),
        (SELECT $17::uuid[]), (SELECT $18::text[]), (SELECT $19::text[]), (SELECT $20::bigint[]),
        (SELECT $21::text[]), (SELECT $22::timestamptz[])
    ) WITH ORDINALITY AS t(outbox_id, message_id, source, destination, message_key, event_type,
        schema_version, content_type, schema_registry, schema_subject, schema_version_ref,
        schema_id, schema_fingerprint, source_event_id, source_global_position, causation_id,
        correlation_id, traceparent, tracestate, span, attributes, occurred_at, ord)`

// sqlEnqueueOne is sqlEnqueue's input of one event: $1..$22 are its columns.
const sqlEnqueueOne = `SELECT $1::uuid AS outbox_id, $2::text AS message_id, $3::text AS source,
        $4::text AS destination, $5::text AS message_key, $6::text AS event_type,
        $7::bigint AS schema_version, $8::text AS content_type, $9::text AS schema_registry,
        $10::text AS schema_subject, $11::bigint AS schema_version_ref, $12::bigint AS schema_id,
        $13::text AS schema_fingerprint, $14::uuid AS source_event_id,
        $15::bigint AS source_global_position, $16::uuid AS causation_id,
        $17::uuid AS correlation_id, $18::text AS traceparent, $19::text AS tracestate,
        $20::bytea AS payload_bytes, $21::text AS attributes, $22::timestamptz AS occurred_at,
        1::bigint AS ord`

// The sleep locks are advisory lock keys (two int4s, a key space apart from the one-int8 keys
// of the per-key enqueue locks) that make EnqueueTx notify only while a relay sleeps:
//
//   - a relay about to sleep takes its key exclusively on its own session (pg_try_advisory_lock)
//     and holds it until it wakes; it falls asleep only after one more claim with the lock held;
//   - EnqueueTx, having inserted rows, tries to take both keys shared until the end of its
//     transaction and notifies only when that fails: when a relay sleeps (or is falling asleep).
//
// A producer that took them shared did not notify, and holds them until its transaction ends,
// so a relay's try fails until every such producer has committed or rolled back; the relay then
// claims once more with the lock held and sees their rows. Every later producer finds the lock
// taken and notifies. No committed row waits for the poll interval, and while the relays are
// busy, producers skip the NOTIFY, which serializes committers (BENCHMARKS.md "Enqueue").
//
// Relays that publish every destination use sleepLockAll; a relay restricted to some
// destinations uses sleepLockFiltered. Only one relay can hold a key: a relay that finds its key
// held by another relay sleeps without it if that relay covers every row it could claim (both
// publish all destinations), and otherwise keeps trying (the sleeper may not claim its rows).
var (
	sleepLockAll      = advisorylock.OutboxSleepAll(schemaLiteral)
	sleepLockFiltered = advisorylock.OutboxSleepFiltered(schemaLiteral)
)

// sqlSleepLock tries to take a sleep lock ({{key}}) on a relay's session and says why it could
// not: 'taken'; 'producers' (held shared only: producers that did not notify are in their
// transactions; probed by taking and releasing it shared); 'relay' (held exclusively: another
// relay sleeps, and producers notify). sqlSleepUnlock releases it.
const (
	sqlSleepLock = `SELECT CASE
    WHEN pg_try_advisory_lock({{key}}) THEN 'taken'
    WHEN pg_try_advisory_lock_shared({{key}}) AND pg_advisory_unlock_shared({{key}}) THEN 'producers'
    ELSE 'relay' END`
	sqlSleepUnlock = `SELECT pg_advisory_unlock({{key}})`
)

// sqlDeclareSource and sqlRevokeSource add and remove per-source declarations (a source's
// writers then take one lock per source instead of one per key); sqlListSources lists them.
// Each change waits for the outbox's running writers (keiro_outbox_source's statement trigger).
const (
	sqlDeclareSource = `
INSERT INTO {{schema}}.keiro_outbox_source (source)
SELECT s FROM unnest($1::text[]) AS s
ON CONFLICT (source) DO NOTHING`
	sqlRevokeSource = `DELETE FROM {{schema}}.keiro_outbox_source WHERE source = ANY($1::text[])`
	sqlListSources  = `SELECT source FROM {{schema}}.keiro_outbox_source ORDER BY source`
)

// The share statements run on a relay's share session (outbox/internal/shares), with the
// relay's share group as $1 (locks.go):
//
//   - sqlShareJoin takes the group's member lock shared, for the session's life;
//   - sqlShareMembers counts the group's relays: the sessions holding its member lock;
//   - sqlShareTake tries, without waiting, the locks of the shares not in $2 (those the relay
//     holds), in share order from $4, and stops after $3 taken; it returns the shares taken. A
//     held share is never tried again (a session's advisory locks stack).
//   - sqlShareRelease releases the shares in $2 and returns how many it held.
const (
	sqlShareJoin    = `SELECT pg_try_advisory_lock_shared({{share_member_lock}})`
	sqlShareMembers = `
SELECT count(*) FROM pg_catalog.pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND granted
  AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
  AND (classid::int4, objid::int4) = ({{share_member_lock}})`
	sqlShareTake = `
SELECT s FROM (SELECT (i + $4::int) % 64 AS s FROM generate_series(0, 63) i) t
WHERE CASE WHEN s = ANY($2::int[]) THEN false ELSE pg_try_advisory_lock({{share_lock}}) END
LIMIT $3`
	sqlShareRelease = `SELECT count(*) FILTER (WHERE pg_advisory_unlock({{share_lock}})) FROM unnest($2::int[]) s`
)

// claimable is the predicate of a row the relay may claim now: pending or failed and due, or
// publishing with an expired lease (its relay died or stalled; the attempt it used stays
// counted). An exactly-once relay (its claim sets keiro.claim_txn, ClaimTxnSetting) does not
// re-claim a row an exactly-once relay's claim holds (claim_txn set): that row's record may be
// committed on Kafka, and only the recovery of its transactional id (sqlRecoverTxn) can tell.
// Until then the row blocks its group as a live lease does.
const claimable = `((%[1]s.status IN ('pending', 'failed') AND %[1]s.next_attempt_at <= now())
     OR (%[1]s.status = 'publishing' AND %[1]s.lease_until <= now()
         AND (%[1]s.claim_txn IS NULL OR ` + claimTxnUnset + `)))`

// ClaimTxnSetting is the transaction-local setting through which an exactly-once relay's claim
// passes its transactional id to the claim statement (set_config in the claim's transaction):
// the statements keep their parameters, and a claim without it is an at-least-once claim.
const ClaimTxnSetting = "keiro.claim_txn"

// claimTxn is the claim's transactional id, NULL for an at-least-once claim (a pooled
// session that once set the setting reads it back as an empty string afterwards).
const claimTxn = `nullif(current_setting('` + ClaimTxnSetting + `', true), '')`

// claimTxnUnset is true in an at-least-once claim.
const claimTxnUnset = claimTxn + ` IS NULL`

// InShare is the claims' test that a row is in the relay's claim shares
// (outbox/internal/shares): %[1]s is the parameter holding them as a bit set (bit i for share
// i), NULL for every row, and %[2]s the row's share, one of the share expressions below. Shares
// are a preference, not a fence: which relay claims a row never matters to its order or its
// lease (see outbox/internal/shares).
const InShare = `(%[1]s::bigint IS NULL OR (%[1]s::bigint >> %[2]s) & 1 = 1)`

// The claim share of row %[1]s, 0..claimShares-1, per policy: the per-key policies hash the
// row's (source, key), so a key's rows share a share, and spread the unordered null-key rows
// by seq; PerSourceStream hashes the source; BestEffort spreads every row by seq. No column
// stores it: it is computed on each candidate, which a claim reads anyway. 63 and 64 here and
// in sqlShareTake are claimShares. ShareOfKey is the per-key policies' share.
const (
	ShareOfKey    = `((coalesce(hashtextextended(%[1]s.source || chr(31) || %[1]s.message_key, 0), %[1]s.seq) & 63)::int)`
	shareOfSource = `((hashtextextended(%[1]s.source, 0) & 63)::int)`
	shareOfSeq    = `((%[1]s.seq & 63)::int)`
)

// sqlClaim claims up to $4 rows in seq order in one statement (keiro §1.3.4 with seq as the
// order, a claim token and a lease):
//
//   - candidate: claimable rows, oldest first, locked FOR UPDATE SKIP LOCKED, keeping only rows
//     whose group head (the group's first non-terminal row, found through the head-of-line or
//     source-order index) is claimable ({{pre}}). A head in backoff or publishing under a live
//     lease blocks its whole group.
//   - gaps/ready ({{post}}): per group in the candidates, the first non-terminal row that is NOT
//     a candidate (locked by another claimer, or blocked); candidates after that gap are
//     dropped, so a tail never jumps a head another claimer holds. Finding the gap walks the
//     group's rows once, so a hot key costs O(batch), not O(batch²), and starts at the
//     group's head (the candidates' head_seq, from the same snapshot): the sent rows in front
//     of a head leave dead entries in the partial indexes until a vacuum, and a probe from the
//     key's first entry stepped over all of them (see outbox/internal/vacuum). A key whose only
//     candidate is its head (the head lookup's row, in the same snapshot) cannot have a gap
//     before it and is not probed: in a drain over many keys that is almost every key, and
//     the probe was a quarter of the claim. Candidates meet their
//     group's gap through a window over candidates ∪ gaps (a sort), not a join: with few rows
//     estimated the planner joined them by a nested loop, 512×512 comparisons per claim.
//   - the UPDATE moves ready rows to publishing with a fresh claim token ($1) and lease
//     (now() + $3 microseconds), counting an attempt. A row re-claimed after its lease expired
//     on its last attempt ($2 = max attempts) goes dead instead if that attempt's produce
//     started (produce_started, set by sqlStartProduce): its outcome is unknown. If
//     the produce never started (a claim whose reply was lost, a relay paused or stopped
//     before it produced), the last attempt never ran: the row is claimed for it again,
//     without counting another attempt. Either way the claim clears produce_started: a new
//     claim's produce has not started.
//
// $5 optionally restricts the destinations (NULL = all). $6 optionally bounds the scan to the
// first $6 open rows of those destinations in seq order (NULL = the whole backlog): when every
// key near the front is in flight, an unbounded claim walks the whole backlog to find nothing.
// The bound is one comparison with a value computed once (no OR with "$6 IS NULL"), so it is
// the claim index scan's stop condition: an OR made it a filter, and a claim with a budget
// still walked every row behind it (176 ms at 200k rows, every head in flight). $7 optionally
// restricts the candidates to the relay's claim shares (a bit set, bit i for share i; NULL =
// every row): see InShare and outbox/internal/shares.
const sqlClaim = `
WITH candidate AS (
    SELECT r.outbox_id, r.seq, r.source, r.message_key, r.status, {{head_seq}} AS head_seq
    FROM {{schema}}.keiro_outbox r {{prejoin}}
    WHERE r.phase = 0 AND ` + `{{claimable_r}}` + `
      AND ($5::text[] IS NULL OR r.destination = ANY($5::text[]))
      AND {{in_share_r}}
      AND r.seq <= coalesce(
          (SELECT b.seq FROM {{schema}}.keiro_outbox b
           WHERE $6::bigint IS NOT NULL AND b.phase = 0
             AND ($5::text[] IS NULL OR b.destination = ANY($5::text[]))
           ORDER BY b.seq OFFSET $6 - 1 LIMIT 1),
          9223372036854775807)
      AND {{pre}}
    ORDER BY r.seq
    LIMIT $4
    FOR UPDATE OF r SKIP LOCKED
)`

// sqlClaimTail is the rest of every claim statement, after its candidate CTE.
const sqlClaimTail = `, {{post}}, updated AS (
    UPDATE {{schema}}.keiro_outbox o SET
        status = CASE WHEN {{ran_last}} THEN 'dead' ELSE 'publishing' END,
        attempt_count = CASE WHEN o.status = 'publishing' AND o.attempt_count >= $2 THEN o.attempt_count ELSE o.attempt_count + 1 END,
        claim_token = CASE WHEN {{ran_last}} THEN NULL ELSE $1::uuid END,
        claim_txn = CASE WHEN {{ran_last}} THEN NULL ELSE ` + claimTxn + ` END,
        produce_started = false,
        lease_until = CASE WHEN {{ran_last}} THEN NULL ELSE now() + $3::bigint * interval '1 microsecond' END,
        last_error = CASE WHEN {{ran_last}}
            THEN 'lease expired after final attempt' || coalesce(' (last error: ' || o.last_error || ')', '')
            ELSE o.last_error END,
        updated_at = now()
    FROM ready
    WHERE o.outbox_id = ready.outbox_id
    RETURNING ready.status AS old_status, o.*
)
SELECT u.old_status, u.status, u.seq, u.attempt_count, u.created_at,
    u.outbox_id, u.source, u.message_id, u.destination, u.message_key, u.event_type,
    u.schema_version, u.content_type, u.schema_registry, u.schema_subject, u.schema_version_ref,
    u.schema_id, u.schema_fingerprint, u.source_event_id, u.source_global_position,
    u.causation_id, u.correlation_id, u.traceparent, u.tracestate, u.payload_bytes,
    u.attributes::text, u.occurred_at
FROM updated u ORDER BY u.seq`

// sqlClaimKeys is the claim of the per-key policies that looks past the front of the backlog
// (the relay's periodic deep claim): it finds the claimable heads by key, not by walking the
// backlog, so its cost follows the number of keys and the batch, never the rows behind the
// heads (when every key near the front is in flight, a walk in seq order visits the whole
// backlog to find nothing).
//
//   - heads: a loose index scan of the head-of-line index, one descent per key: each step jumps
//     from a key's head to the next key's first open row, skipping the key's tail. It carries
//     the count of claimable heads found and stops at $4 of them, so it visits the keys in
//     flight and at most a batch of others. Keys come in key order, not seq order; the claim of
//     the front of the backlog (sqlClaim with a scan budget) keeps the oldest rows first.
//   - ok: a head is claimable and in the relay's claim shares ($6, as sqlClaim's $7), so a
//     relay that prefers its shares counts and takes only their heads.
//   - the walk starts after the key ($7, $8) (two empty strings: at the first key, sources are never
//     empty): a relay's next claim past the front resumes after the keys its last one took
//     (claimsql.KeyCursor). From the first key every claim walked again the keys in flight, which are
//     the first ones: MaxInFlightBatches batches' keys for each relay on the table, five
//     descents per row claimed with one relay and twenty with four.
//   - eligible: the claimable heads of the relay's destinations; each brings the first rows of
//     its run, from its head on (the index descent lands on the head, past the dead entries
//     the key's sent rows left in front of it) (up to ceil($4 / their number), so a batch spreads over the keys as a walk in seq
//     order would), locked FOR UPDATE SKIP LOCKED, and null-key rows come through their own
//     index (keiro_outbox_null_key_idx, migration outbox_heads). The oldest $4 are candidates.
//
// The post-filter, the update and the result are sqlClaim's.
const sqlClaimKeys = `
WITH RECURSIVE heads AS (
    (SELECT h.source, h.message_key, h.seq, h.destination, {{claimable_h}} AND {{in_share_h}} AS ok,
         CASE WHEN {{claimable_h}} AND {{in_share_h}} THEN 1 ELSE 0 END AS found
     FROM {{schema}}.keiro_outbox h
     WHERE h.phase = 0 AND h.message_key IS NOT NULL
       AND (h.source, h.message_key) > ($7::text, $8::text)
     ORDER BY h.source, h.message_key, h.seq LIMIT 1)
    UNION ALL
    SELECT n.source, n.message_key, n.seq, n.destination, n.ok, k.found + CASE WHEN n.ok THEN 1 ELSE 0 END
    FROM heads k CROSS JOIN LATERAL (
        SELECT h.source, h.message_key, h.seq, h.destination, {{claimable_h}} AND {{in_share_h}} AS ok
        FROM {{schema}}.keiro_outbox h
        WHERE h.phase = 0 AND h.message_key IS NOT NULL
          AND (h.source, h.message_key) > (k.source, k.message_key)
        ORDER BY h.source, h.message_key, h.seq LIMIT 1) n
    WHERE k.found < $4
), eligible AS MATERIALIZED (
    SELECT source, message_key, seq FROM heads
    WHERE ok AND ($5::text[] IS NULL OR destination = ANY($5::text[]))
    ORDER BY seq LIMIT $4
), candidate AS (
    SELECT * FROM (
        SELECT r.outbox_id, r.seq, r.source, r.message_key, r.status, e.seq AS head_seq
        FROM eligible e CROSS JOIN LATERAL (
            SELECT r.outbox_id, r.seq, r.source, r.message_key, r.status
            FROM {{schema}}.keiro_outbox r
            WHERE r.source = e.source AND r.message_key = e.message_key AND r.seq >= e.seq
              AND r.phase = 0 AND {{claimable_r}}
              AND ($5::text[] IS NULL OR r.destination = ANY($5::text[]))
            ORDER BY r.source, r.message_key, r.seq
            LIMIT (($4 + (SELECT count(*) FROM eligible) - 1) / greatest((SELECT count(*) FROM eligible), 1))
            FOR UPDATE OF r SKIP LOCKED) r
        UNION ALL
        SELECT * FROM (
            SELECT r.outbox_id, r.seq, r.source, r.message_key, r.status, NULL::bigint AS head_seq
            FROM {{schema}}.keiro_outbox r
            WHERE r.phase = 0 AND r.message_key IS NULL AND {{claimable_r}}
              AND ($5::text[] IS NULL OR r.destination = ANY($5::text[])) AND {{in_share_r}}
            ORDER BY r.seq
            LIMIT $4
            FOR UPDATE OF r SKIP LOCKED) z
    ) c
    ORDER BY c.seq
    LIMIT $4
)`

// ranLast is the claim's test for a row whose lease expired on its last attempt after that
// attempt's produce started (sqlStartProduce set produce_started).
const ranLast = `(o.status = 'publishing' AND o.attempt_count >= $2 AND o.produce_started)`

// Claim filters per ordering policy. "non-terminal" rows are pending, failed or publishing.
// Per-key lookups go through the head-of-line index; per-source lookups walk the claim index in
// seq order (PerSourceStream is rare and has few sources: a dedicated (source, seq) index would
// tempt the planner away from the head-of-line index for per-key lookups when statistics are
// missing, and costs every write).
const (
	// The group head is looked up in a LATERAL join, so the planner can memoize it per key
	// (a hot key's batch probes the index once, not once per row).
	preJoinKey = `LEFT JOIN LATERAL (
        SELECT {{claimable_h}} AS ok, h.seq FROM {{schema}}.keiro_outbox h
        WHERE h.source = r.source AND h.message_key = r.message_key
          AND h.phase = 0
        ORDER BY h.source, h.message_key, h.seq LIMIT 1) head ON true`
	preKey  = `(r.message_key IS NULL OR head.ok)`
	postKey = `gaps AS MATERIALIZED (
    SELECT k.source, k.message_key, g.seq
    FROM (SELECT source, message_key, min(head_seq) AS head_seq FROM candidate WHERE message_key IS NOT NULL
          GROUP BY source, message_key
          HAVING count(*) > 1 OR min(seq) <> min(head_seq)) k
    CROSS JOIN LATERAL (
        SELECT e.seq FROM {{schema}}.keiro_outbox e
        WHERE e.source = k.source AND e.message_key = k.message_key AND e.seq >= coalesce(k.head_seq, '-9223372036854775808'::bigint)
          AND e.phase = 0
          AND e.outbox_id NOT IN (SELECT outbox_id FROM candidate)
        ORDER BY e.source, e.message_key, e.seq LIMIT 1) g
), ready AS (
    SELECT y.outbox_id, y.status FROM (
        SELECT x.outbox_id, x.status, x.seq, x.gap,
            min(x.seq) FILTER (WHERE x.gap) OVER (PARTITION BY x.source, x.message_key) AS gap_seq
        FROM (
            SELECT c.outbox_id, c.status, c.seq, c.source, c.message_key, false AS gap FROM candidate c
            UNION ALL
            SELECT NULL, NULL, g.seq, g.source, g.message_key, true FROM gaps g
        ) x
    ) y
    WHERE NOT y.gap AND (y.gap_seq IS NULL OR y.seq < y.gap_seq)
)`
	preJoinSource = `LEFT JOIN LATERAL (
        SELECT {{claimable_h}} AS ok, h.seq FROM {{schema}}.keiro_outbox h
        WHERE h.source = r.source AND h.phase = 0
        ORDER BY h.source, h.seq LIMIT 1) head ON true`
	preSource  = `head.ok`
	postSource = `gaps AS MATERIALIZED (
    SELECT k.source, g.seq
    FROM (SELECT DISTINCT source FROM candidate) k
    CROSS JOIN LATERAL (
        SELECT e.seq FROM {{schema}}.keiro_outbox e
        WHERE e.source = k.source AND e.phase = 0
          AND e.outbox_id NOT IN (SELECT outbox_id FROM candidate)
        ORDER BY e.source, e.seq LIMIT 1) g
), ready AS (
    SELECT y.outbox_id, y.status FROM (
        SELECT x.outbox_id, x.status, x.seq, x.gap,
            min(x.seq) FILTER (WHERE x.gap) OVER (PARTITION BY x.source) AS gap_seq
        FROM (
            SELECT c.outbox_id, c.status, c.seq, c.source, false AS gap FROM candidate c
            UNION ALL
            SELECT NULL, NULL, g.seq, g.source, true FROM gaps g
        ) x
    ) y
    WHERE NOT y.gap AND (y.gap_seq IS NULL OR y.seq < y.gap_seq)
)`
	postNone = `ready AS (SELECT c.outbox_id, c.status FROM candidate c)`
)

// sqlMark applies one batch's outcomes in one statement, fenced by the claim token: a row that
// is no longer publishing under token $1 (re-claimed after its lease expired, or requeued) is
// left alone. $2..$8 are parallel arrays (id, outcome, error text, retry delay in
// microseconds, partition, offset, rejection code); $9 is the attempt ceiling at which a
// failure goes dead. The token is cleared, and produce_started with it.
// Outcomes: sent; failed (or dead when the ceiling is reached); skipped (failed, attempt
// refunded, due now); deferred (failed during a Kafka outage, attempt refunded, due after the
// delay); released (pending, attempt refunded); rejected (terminal). {{attempt_errors}} is
// empty in Mark, the statement of a batch without failures (the common case, which so does not
// pay for it), and markHistory in MarkHistory: a failed or rejected produce appends its attempt
// to attempt_errors (the last 20 kept).
const sqlMark = `
UPDATE {{schema}}.keiro_outbox o SET
    status = CASE m.outcome
        WHEN 'sent' THEN 'sent'
        WHEN 'rejected' THEN 'rejected'
        WHEN 'released' THEN 'pending'
        WHEN 'skipped' THEN 'failed'
        WHEN 'deferred' THEN 'failed'
        ELSE CASE WHEN o.attempt_count >= $9 THEN 'dead' ELSE 'failed' END END,
    attempt_count = CASE WHEN m.outcome IN ('skipped', 'released', 'deferred') THEN greatest(o.attempt_count - 1, 0) ELSE o.attempt_count END,
    next_attempt_at = CASE m.outcome
        WHEN 'failed' THEN now() + m.delay_us * interval '1 microsecond'
        WHEN 'deferred' THEN now() + m.delay_us * interval '1 microsecond'
        WHEN 'skipped' THEN now()
        WHEN 'released' THEN now()
        ELSE o.next_attempt_at END,
    last_error = CASE m.outcome WHEN 'sent' THEN NULL WHEN 'released' THEN o.last_error ELSE m.err END,
{{attempt_errors}}    published_at = CASE WHEN m.outcome = 'sent' THEN now() ELSE o.published_at END,
    kafka_partition = CASE WHEN m.outcome = 'sent' THEN m.part ELSE o.kafka_partition END,
    kafka_offset = CASE WHEN m.outcome = 'sent' THEN m.off ELSE o.kafka_offset END,
    rejected_at = CASE WHEN m.outcome = 'rejected' THEN now() ELSE o.rejected_at END,
    rejection_code = CASE WHEN m.outcome = 'rejected' THEN m.code ELSE o.rejection_code END,
    claim_token = NULL,
    produce_started = false,
    lease_until = NULL,
    updated_at = now()
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::int[], $7::bigint[], $8::text[])
    AS m(id, outcome, err, delay_us, part, off, code)
WHERE o.outbox_id = m.id AND o.claim_token = $1::uuid AND o.status = 'publishing'
RETURNING o.outbox_id, m.outcome, o.status`

// markHistory is sqlMark's attempt_errors assignment in MarkHistory.
const markHistory = `    attempt_errors = CASE WHEN m.outcome IN ('failed', 'rejected') THEN jsonb_path_query_array(
        coalesce(o.attempt_errors, '[]'::jsonb) || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
            'attempt', o.attempt_count, 'at', now(), 'error', left(m.err, 1024), 'code', nullif(m.code, '')))),
        '$[last - 19 to last]') ELSE o.attempt_errors END,
`

// sqlRenew extends the lease of a batch still in flight: its rows ($2) still publishing under
// claim token $1 get a lease of $3 microseconds from now. A row that is not (its lease expired
// and another relay took it over) is left alone and not counted.
const sqlRenew = `
UPDATE {{schema}}.keiro_outbox SET lease_until = now() + $3::bigint * interval '1 microsecond'
WHERE outbox_id = ANY($2::uuid[]) AND claim_token = $1::uuid AND status = 'publishing'`

// sqlStartProduce records that the produce of rows on their last attempt starts: the rows ($2)
// still publishing under claim token $1 get produce_started, which the claim reads when their
// lease expires (ranLast). It returns the rows it recorded: a row missing was taken over by
// another relay and must not be produced. No index covers the column: the update is HOT.
const sqlStartProduce = `
UPDATE {{schema}}.keiro_outbox SET produce_started = true
WHERE outbox_id = ANY($2::uuid[]) AND claim_token = $1::uuid AND status = 'publishing'
RETURNING outbox_id`

// sqlReleaseLostClaim releases the rows of a claim whose reply was lost (the relay saw an error,
// so it cannot tell whether the claim committed): rows still publishing under its token $1 go
// back to pending, due now, with the attempt refunded, as a mark's 'released' does. It does so
// only once the claim's backend ($2, its process id) is gone: a backend still running (the
// network, not the server, lost the reply) could commit the claim after this statement, so the
// relay asks again later. It returns whether the backend is still alive and how many rows it
// released. It walks the open rows (the claim index), not the retained ones: a lost reply is
// rare, and a claim token index would make every claim write an index entry (no HOT update).
const sqlReleaseLostClaim = `
WITH backend AS MATERIALIZED (
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity WHERE pid = $2) AS alive
), released AS (
    UPDATE {{schema}}.keiro_outbox SET status = 'pending', attempt_count = greatest(attempt_count - 1, 0),
        next_attempt_at = now(), claim_token = NULL, produce_started = false, lease_until = NULL,
        updated_at = now()
    WHERE phase = 0 AND status = 'publishing' AND claim_token = $1::uuid
      AND NOT (SELECT alive FROM backend)
    RETURNING 1
)
SELECT (SELECT alive FROM backend), (SELECT count(*) FROM released)`

// sqlRecoverableTxns lists the transactional ids of exactly-once claims lost with their relay:
// rows still publishing under an expired lease with claim_txn set. It walks the open rows (the
// claim index): claim_txn has no index of its own (it would make every claim a non-HOT update),
// and the recovery probe runs at most every half lease.
const sqlRecoverableTxns = `
SELECT DISTINCT claim_txn FROM {{schema}}.keiro_outbox
WHERE phase = 0 AND status = 'publishing' AND claim_txn IS NOT NULL AND lease_until <= now()`

// sqlRecoverTxn settles the rows of a lost exactly-once claim once its transactional id ($1) is
// fenced and its last committed claims record read: every row still publishing under claim_txn
// $1 with an expired lease, unless its claim token is in $4 (claims its own relay still
// handles), is marked sent when its (claim token, seq) is in the record ($2, $3: parallel
// arrays) (its record is committed on Kafka; where is unknown here, so kafka_partition and
// kafka_offset stay NULL) and released otherwise (pending, due now, attempt refunded, as a
// mark's 'released': its record never committed, and a claim publishes it again). Each row is
// re-checked under its lock (the fence of a mark), so a mark of the relay itself that landed
// first wins. It returns each row moved and whether it went sent.
const sqlRecoverTxn = `
WITH listed AS MATERIALIZED (
    SELECT DISTINCT l.token, l.seq FROM unnest($2::uuid[], $3::bigint[]) AS l(token, seq)
), lost AS (
    SELECT o.outbox_id, o.claim_token,
        EXISTS (SELECT 1 FROM listed l WHERE l.token = o.claim_token AND l.seq = o.seq) AS committed
    FROM {{schema}}.keiro_outbox o
    WHERE o.phase = 0 AND o.status = 'publishing' AND o.claim_txn = $1 AND o.lease_until <= now()
      AND o.claim_token <> ALL(coalesce($4::uuid[], '{}'))
)
UPDATE {{schema}}.keiro_outbox o SET
    status = CASE WHEN l.committed THEN 'sent' ELSE 'pending' END,
    attempt_count = CASE WHEN l.committed THEN o.attempt_count ELSE greatest(o.attempt_count - 1, 0) END,
    next_attempt_at = CASE WHEN l.committed THEN o.next_attempt_at ELSE now() END,
    last_error = CASE WHEN l.committed THEN NULL ELSE o.last_error END,
    published_at = CASE WHEN l.committed THEN now() ELSE o.published_at END,
    claim_token = NULL,
    claim_txn = NULL,
    produce_started = false,
    lease_until = NULL,
    updated_at = now()
FROM lost l
WHERE o.outbox_id = l.outbox_id AND o.status = 'publishing' AND o.claim_token = l.claim_token
  AND o.claim_txn = $1
RETURNING o.outbox_id, l.committed`

// sqlRetention deletes at most $2 sent rows published before now() - $1 microseconds, oldest
// first, through the sent_gc index, if it gets the maintenance lock $3 (transaction-scoped, so
// it is safe behind PgBouncer in transaction mode: no session keeps a lock). It returns
// whether it got the lock and how many rows it deleted. Small batches keep row locks and WAL
// bursts short.
const sqlRetention = `
WITH lock AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($3) AS got),
del AS (
    DELETE FROM {{schema}}.keiro_outbox
    WHERE outbox_id IN (
        SELECT outbox_id FROM {{schema}}.keiro_outbox
        WHERE (SELECT got FROM lock) AND phase = 1 AND published_at < now() - $1::bigint * interval '1 microsecond'
        ORDER BY published_at
        LIMIT $2)
    RETURNING 1)
SELECT (SELECT got FROM lock), (SELECT count(*) FROM del)`

// sqlLogMark records a mark of log-mode retention (migration 009's keiro_outbox_log_marks): the
// time and the WAL position, unless a mark of the last minute exists, if it gets the maintenance
// lock $1.
const sqlLogMark = `
WITH lock AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($1) AS got),
ins AS (
    INSERT INTO {{schema}}.keiro_outbox_log_marks (at, lsn)
    SELECT clock_timestamp(), pg_catalog.pg_current_wal_lsn()
    WHERE (SELECT got FROM lock) AND NOT EXISTS (
        SELECT 1 FROM {{schema}}.keiro_outbox_log_marks WHERE at > now() - interval '1 minute')
    RETURNING 1)
SELECT (SELECT got FROM lock), (SELECT count(*) FROM ins)`

// sqlLogRetention deletes up to $2 rows of keiro_outbox_log older than the retention $1 (µs)
// that every log-mode slot of the schema has confirmed (sqlLogSlots: the slots named after a
// publication of keiro_outbox_log; with per-destination relays there are several), among them
// the relay's own slot $4, if it gets the maintenance lock $3, and of the destinations $5 (NULL:
// all; the relay passes those some slot publishes, so that the rows of a destination no slot
// publishes stay for a recovery). Confirmed means written an hour or more before the newest mark the
// lowest confirmed_flush_lsn of those slots has passed (a transaction that committed after the
// mark started before it, and transactions are taken to last under an hour). Without such a
// mark (no slot, the relay's own slot missing, a slot that confirms nothing, an invalidated
// slot among them) nothing is
// deleted: the table is what recovers the events a slot did not confirm. The marks older than
// that newest confirmed one are forgotten. A deleted row that a slot still had to decode is
// published all the same (decoding reads the WAL, not the table, and the publication
// publishes no deletes); the mark protects the recovery copy only.
const sqlLogRetention = `
WITH lock AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($3) AS got),
slots AS MATERIALIZED (
    SELECT s.confirmed_flush_lsn AS lsn, coalesce(s.wal_status, '') AS wal_status, s.slot_name = $4 AS own
    FROM pg_catalog.pg_publication_tables t
    JOIN pg_catalog.pg_replication_slots s ON s.slot_name = t.pubname AND s.database = current_database()
    WHERE (SELECT got FROM lock) AND t.schemaname = '{{schema}}' AND t.tablename = 'keiro_outbox_log'),
low AS MATERIALIZED (
    SELECT min(lsn) AS lsn FROM slots
    HAVING bool_or(own) AND bool_and(lsn IS NOT NULL AND wal_status <> 'lost')),
mark AS MATERIALIZED (
    SELECT max(m.at) AS at FROM {{schema}}.keiro_outbox_log_marks m, low
    WHERE m.lsn <= low.lsn),
cutoff AS MATERIALIZED (
    SELECT least(now() - $1::bigint * interval '1 microsecond', at - interval '1 hour') AS t
    FROM mark WHERE at IS NOT NULL),
del AS (
    DELETE FROM {{schema}}.keiro_outbox_log
    WHERE ctid = ANY (ARRAY(
        SELECT l.ctid FROM {{schema}}.keiro_outbox_log l, cutoff
        WHERE l.created_at < cutoff.t AND ($5::text[] IS NULL OR l.destination = ANY ($5::text[]))
        LIMIT $2))
    RETURNING 1),
forget AS (
    DELETE FROM {{schema}}.keiro_outbox_log_marks m USING mark
    WHERE m.at < mark.at)
SELECT (SELECT got FROM lock), (SELECT count(*) FROM del)`

// sqlGauges samples, per destination, the backlog, the oldest pending age and the dead count
// (archived rows aside: an operator set them aside, they need no alert),
// if it gets the maintenance lock $1. The oldest pending age is that of the oldest open row,
// publishing ones included: a row stuck publishing (a produce that cannot complete, with two
// brokers of three down) is as unpublished as a pending one, and the alert on the age must see it.
// The first column says whether it did: one row with got
// false and nulls otherwise; with the lock and no open or dead row, one row with a null
// destination.
const sqlGauges = `
SELECT l.got, g.destination, coalesce(g.backlog, 0), coalesce(g.age, 0), coalesce(g.dead, 0)
FROM (SELECT pg_try_advisory_xact_lock($1) AS got) l
LEFT JOIN LATERAL (
    SELECT destination,
        count(*) FILTER (WHERE phase = 0) AS backlog,
        extract(epoch FROM now() - min(created_at) FILTER (WHERE phase = 0))::float8 AS age,
        count(*) FILTER (WHERE phase = 2 AND archived_at IS NULL) AS dead
    FROM {{schema}}.keiro_outbox
    WHERE l.got AND phase IN (0, 2)
    GROUP BY destination) g ON true`

// sqlStatus counts rows per status, destination and archived or not (archived_at, migration
// 011_archive.sql).
const sqlStatus = `
SELECT status, destination, archived_at IS NOT NULL, count(*), min(created_at)
FROM {{schema}}.keiro_outbox GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`

// sqlStatusUnarchived is sqlStatus on a schema before migration 011, which has no archived rows.
const sqlStatusUnarchived = `
SELECT status, destination, false, count(*), min(created_at)
FROM {{schema}}.keiro_outbox GROUP BY status, destination ORDER BY status, destination`

// sqlHasArchive tells whether keiro_outbox has archived_at (migration 011_archive.sql applied).
const sqlHasArchive = `
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
WHERE attrelid = to_regclass('{{schema}}.keiro_outbox') AND attname = 'archived_at' AND NOT attisdropped)`

// sqlListDead lists dead and rejected rows that are not archived after seq $1, optionally of one
// source ($2) and one destination ($3), at most $4.
const sqlListDead = `
SELECT seq, outbox_id, message_id, source, destination, message_key, status, attempt_count,
    last_error, rejection_code, updated_at
FROM {{schema}}.keiro_outbox
WHERE phase = 2 AND archived_at IS NULL AND seq > $1
  AND ($2::text IS NULL OR source = $2) AND ($3::text IS NULL OR destination = $3)
ORDER BY seq LIMIT $4`

// sqlRequeue puts dead and rejected rows back to pending with a fresh attempt budget:
// the ids in $1 (archived or not: a requeue brings an archived row back), or every row not
// archived of source $2 and/or destination $4, or all of them ($3). It returns their ids in seq
// order.
const sqlRequeue = `
WITH moved AS (
UPDATE {{schema}}.keiro_outbox SET status = 'pending', attempt_count = 0, next_attempt_at = now(),
    rejected_at = NULL, rejection_code = NULL, claim_token = NULL, produce_started = false,
    lease_until = NULL, updated_at = now(), archived_at = NULL
WHERE phase = 2
  AND (outbox_id = ANY($1::uuid[])
       OR (archived_at IS NULL
           AND ((($2::text IS NOT NULL OR $4::text IS NOT NULL)
                 AND ($2::text IS NULL OR source = $2) AND ($4::text IS NULL OR destination = $4))
                OR $3::boolean)))
RETURNING outbox_id, seq)
SELECT outbox_id FROM moved ORDER BY seq`

// sqlReject makes the pending and failed rows among the ids in $1 terminal 'rejected' with
// rejection code $2 and detail $3 (last_error; NULL for none), at a caller's request. A row in
// flight (publishing), sent, dead or already rejected is left alone: the row lock makes a
// concurrent claim and the rejection take turns, and the loser sees the winner's status. It
// returns the rejected rows' ids in seq order.
const sqlReject = `
WITH moved AS (
UPDATE {{schema}}.keiro_outbox SET status = 'rejected', rejected_at = now(), rejection_code = $2,
    last_error = $3, claim_token = NULL, lease_until = NULL, produce_started = false, updated_at = now()
WHERE outbox_id = ANY($1::uuid[]) AND status IN ('pending', 'failed')
RETURNING outbox_id, seq)
SELECT outbox_id FROM moved ORDER BY seq`

// sqlDeadLetter writes the log-mode relay's dead letter: an event of keiro_outbox_log that
// Kafka refused for good, as a 'rejected' row of keiro_outbox (where ListDead, Requeue and the
// dead gauge read), with rejection code $23 and error $24, its first attempt counted. $1..$22
// are sqlEnqueueOne's columns of the event. The row keeps the id of its
// keiro_outbox_log row (the id EnqueueTx returned; $1 when that row is gone). The insert
// trigger sends a row that is not pending to keiro_outbox in either mode (migration 009). A
// replayed transaction rejects the event again: the second write does nothing. It returns
// whether it wrote the row.
const sqlDeadLetter = `
INSERT INTO {{schema}}.keiro_outbox (outbox_id, message_id, source, destination,
    message_key, event_type, schema_version, content_type, schema_registry, schema_subject,
    schema_version_ref, schema_id, schema_fingerprint, source_event_id,
    source_global_position, causation_id, correlation_id, traceparent, tracestate,
    payload_bytes, attributes, occurred_at, status, attempt_count, last_error, rejected_at,
    rejection_code)
SELECT coalesce((SELECT l.outbox_id FROM {{schema}}.keiro_outbox_log l
                 WHERE l.source = i.source AND l.message_id = i.message_id), i.outbox_id),
    i.message_id, i.source, i.destination, i.message_key, i.event_type,
    i.schema_version, i.content_type, i.schema_registry, i.schema_subject,
    i.schema_version_ref, i.schema_id, i.schema_fingerprint, i.source_event_id,
    i.source_global_position, i.causation_id, i.correlation_id, i.traceparent, i.tracestate,
    i.payload_bytes, i.attributes::jsonb, i.occurred_at, 'rejected', 1, $24::text, now(), $23::text
FROM ({{input}}) i
ON CONFLICT ON CONSTRAINT keiro_outbox_source_message_id_key DO NOTHING
RETURNING outbox_id`

// sqlReadMode reads the schema's mode; sqlSetMode changes it ($1). The settings table's
// statement trigger fences the change against running writers (migration 009).
const (
	sqlReadMode = `SELECT mode FROM {{schema}}.keiro_outbox_settings`
	// sqlReadModeForUpdate is sqlReadMode holding the row until the transaction ends: the
	// first step of a change, which serializes concurrent ones.
	sqlReadModeForUpdate = `SELECT mode, changed_at FROM {{schema}}.keiro_outbox_settings FOR UPDATE`
	sqlSetMode           = `UPDATE {{schema}}.keiro_outbox_settings SET mode = $1, changed_at = now()`
)

// sqlAnyOpen tells whether keiro_outbox has an open row (pending, failed or publishing) of
// the destinations $1 (NULL: any): the log-mode relay publishes them before it follows the
// slot.
const sqlAnyOpen = `SELECT EXISTS (SELECT 1 FROM {{schema}}.keiro_outbox
WHERE phase = 0 AND ($1::text[] IS NULL OR destination = ANY ($1::text[])))`

// sqlRecoverLog copies the rows of keiro_outbox_log written from $1 to before $2, of the
// destinations $3 (NULL: all), into
// keiro_outbox as 'failed' rows due now, in the order they were written, for the claim loop to
// publish (Admin.RecoverLog): the recovery of the events a lost slot had not confirmed. The insert
// trigger gives them a key lock and a seq, as any row that is not 'pending'. An event already in
// keiro_outbox (a dead letter, a row from before a switch, an earlier recovery) is skipped.
const sqlRecoverLog = `
WITH src AS MATERIALIZED (
    SELECT * FROM {{schema}}.keiro_outbox_log
    WHERE created_at >= $1 AND created_at < $2
      AND ($3::text[] IS NULL OR destination = ANY ($3::text[]))),
ins AS (
    INSERT INTO {{schema}}.keiro_outbox (outbox_id, message_id, source, destination, message_key,
        event_type, schema_version, content_type, schema_registry, schema_subject,
        schema_version_ref, schema_id, schema_fingerprint, source_event_id, source_global_position,
        causation_id, correlation_id, traceparent, tracestate, payload_bytes, attributes,
        occurred_at, status, next_attempt_at, last_error)
    SELECT outbox_id, message_id, source, destination, message_key,
        event_type, schema_version, content_type, schema_registry, schema_subject,
        schema_version_ref, schema_id, schema_fingerprint, source_event_id, source_global_position,
        causation_id, correlation_id, traceparent, tracestate, payload_bytes, attributes,
        occurred_at, 'failed', now(), 'recovered from keiro_outbox_log (relay mode recover)'
    FROM src
    ORDER BY created_at
    ON CONFLICT DO NOTHING
    RETURNING 1)
SELECT (SELECT count(*) FROM src), (SELECT count(*) FROM ins)`

// Log mode's publication and slot (Admin.SetMode), named by a validated slot name. The
// publication publishes keiro_outbox_log's inserts only: retention's deletes are not events.
const (
	sqlCreateSlot = `SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1)`
)

// sqlSlotStatus reads a replication slot's state ($1) for the WAL guard.
const sqlSlotStatus = `SELECT coalesce(active_pid, 0), coalesce(confirmed_flush_lsn::text, ''),
    coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn), 0)::bigint,
    coalesce(wal_status, ''), safe_wal_size
FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`

// failureRows are the dead and rejected rows not archived, grouped by error class (dead, or
// "rejected: " and the rejection code) and normalised last error (adminq), newest failure
// first within a group.
var failureRows = adminq.Table{
	Rows:  `{{schema}}.keiro_outbox WHERE phase = 2 AND archived_at IS NULL`,
	Class: `CASE status WHEN 'rejected' THEN 'rejected: ' || rejection_code ELSE status END`,
	At:    "updated_at", Where: "destination", Key: "outbox_id", Order: "at DESC",
}

// Per-destination log mode (Admin.LogSlots, Admin.PrepareLogSlot). A schema's log-mode slots
// are the replication slots named after a publication of its keiro_outbox_log; a slot's
// destinations are its publication's row filter (logslot.RowFilter). pg_publication_tables
// has rowfilter from PostgreSQL 15 on: to_jsonb reads it on any version (absent is null).
const (
	// sqlRowFilters tells whether the server has publication row filters (PostgreSQL 15).
	sqlRowFilters = `SELECT current_setting('server_version_num')::int >= 150000`
	// sqlClock reads the database's clock (the time keiro_outbox_log's created_at is written in).
	sqlClock = `SELECT clock_timestamp()`
	// sqlDropSlot drops the inactive slot $1 (one a relay created and must give up).
	sqlDropSlot = `SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots
WHERE slot_name = $1 AND NOT active`
	// sqlDropPublication drops the publication {{publication}} (a validated slot name).
	sqlDropPublication = `DROP PUBLICATION IF EXISTS {{publication}}`
	// sqlLogSlots lists the publications of keiro_outbox_log, each with its row filter and
	// the state of the slot of its name (sqlSlotStatus's columns; exists false, zeros and
	// nulls when there is no such slot).
	sqlLogSlots = `
SELECT t.pubname::text, coalesce(to_jsonb(t) ->> 'rowfilter', ''), s.slot_name IS NOT NULL,
    coalesce(s.active_pid, 0), coalesce(s.confirmed_flush_lsn::text, ''),
    coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.restart_lsn), 0)::bigint,
    coalesce(s.wal_status, ''), s.safe_wal_size
FROM pg_catalog.pg_publication_tables t
LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = t.pubname AND s.database = current_database()
WHERE t.schemaname = '{{schema}}' AND t.tablename = 'keiro_outbox_log'
ORDER BY t.pubname`
)
