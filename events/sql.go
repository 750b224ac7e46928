package events

import (
	"github.com/keiro-go/keiro/internal/advisorylock"
	"github.com/keiro-go/keiro/internal/pgtext"
)

// All of the event store's SQL lives in this file. Every statement names its tables through the
// {{schema}} placeholder, replaced once by [newQueries] with a schema name that
// migrations.ValidateSchema accepted, so no statement relies on search_path and none is built
// from user input at run time.

// The stream-row writes, one per expected-version kind. Each returns the stream's new version
// and the writing transaction's xid8 (stored in keiro_events.tx_id). The gap guard in
// subscription.go does not depend on it: it relies on the lock on keiro_events that the INSERT
// holds from before it draws a position (see sqlFence and docs/architecture.md, "Event store").
const (
	sqlStreamAny = `INSERT INTO {{schema}}.keiro_streams AS st (stream_name, category, version)
    VALUES ($1, $2, $3)
    ON CONFLICT (stream_name) DO UPDATE SET version = st.version + excluded.version, updated_at = now()
    RETURNING st.version AS version, pg_current_xact_id() AS xid`
	sqlStreamNoStream = `INSERT INTO {{schema}}.keiro_streams AS st (stream_name, category, version)
    VALUES ($1, $2, $3)
    ON CONFLICT (stream_name) DO NOTHING
    RETURNING st.version AS version, pg_current_xact_id() AS xid`
	sqlStreamExists = `UPDATE {{schema}}.keiro_streams AS st SET version = st.version + $3, updated_at = now()
    WHERE st.stream_name = $1 AND st.category = $2
    RETURNING st.version AS version, pg_current_xact_id() AS xid`
	sqlStreamExact = `UPDATE {{schema}}.keiro_streams AS st SET version = st.version + $3, updated_at = now()
    WHERE st.stream_name = $1 AND st.category = $2 AND st.version = $14
    RETURNING st.version AS version, pg_current_xact_id() AS xid`
)

// sqlAppendTail inserts the events after the stream write s. The INSERT reads s's row, so the
// xid exists before nextval runs; rows are inserted in ordinality order, so global positions
// grow with stream versions. $13 says whether to NOTIFY (delivered at commit). It returns the
// data and metadata as stored (jsonb normalises the caller's bytes), so AppendResult.Events
// are byte for byte what a later read returns.
const sqlAppendTail = `
, ins AS (
    INSERT INTO {{schema}}.keiro_events (event_id, stream_name, category, stream_version, event_type,
        schema_version, data, metadata, correlation_id, causation_id, traceparent, tracestate, tx_id)
    SELECT e.event_id, $1, $2, s.version - $3 + e.ord, e.event_type, e.schema_version, e.data,
        e.metadata, e.correlation_id, e.causation_id, e.traceparent, e.tracestate, s.xid
    FROM s CROSS JOIN unnest($4::uuid[], $5::text[], $6::integer[], $7::jsonb[], $8::jsonb[],
        $9::uuid[], $10::uuid[], $11::text[], $12::text[]) WITH ORDINALITY
        AS e(event_id, event_type, schema_version, data, metadata, correlation_id, causation_id,
             traceparent, tracestate, ord)
    ORDER BY e.ord
    RETURNING global_position, stream_version, recorded_at, data, metadata
), notified AS (
    SELECT pg_notify('{{channel}}', '') FROM (SELECT 1 FROM ins LIMIT 1) x WHERE $13::boolean
)
SELECT global_position, stream_version, recorded_at, (SELECT count(*) FROM notified), data, metadata
FROM ins ORDER BY stream_version`

// sqlAppendTailOne is sqlAppendTail for a single event, with scalar parameters: no arrays to
// encode and unnest, which is most of a one-event command's statement cost besides the writes.
const sqlAppendTailOne = `
, ins AS (
    INSERT INTO {{schema}}.keiro_events (event_id, stream_name, category, stream_version, event_type,
        schema_version, data, metadata, correlation_id, causation_id, traceparent, tracestate, tx_id)
    SELECT $4::uuid, $1, $2, s.version, $5::text, $6::integer, $7::jsonb, $8::jsonb, $9::uuid, $10::uuid,
        $11::text, $12::text, s.xid
    FROM s
    RETURNING global_position, stream_version, recorded_at, data, metadata
), notified AS (
    SELECT pg_notify('{{channel}}', '') FROM (SELECT 1 FROM ins LIMIT 1) x WHERE $13::boolean
)
SELECT global_position, stream_version, recorded_at, (SELECT count(*) FROM notified), data, metadata
FROM ins`

// sqlStreamVersion reads a stream's current version (no row: the stream does not exist).
const sqlStreamVersion = `SELECT version FROM {{schema}}.keiro_streams WHERE stream_name = $1`

// recordedColumns are the columns scanned by scanRecorded, in order.
const recordedColumns = `global_position, event_id, stream_name, stream_version, event_type,
    schema_version, data, metadata, correlation_id, causation_id, traceparent, tracestate, recorded_at`

// sqlExistingIDs reads the stored events whose ids a caller supplied, with whether each has the
// same stream, type, schema version and data as the event being appended.
const sqlExistingIDs = `
SELECT ` + recordedColumnsE + `,
    (e.stream_name = $2 AND e.event_type = i.event_type AND e.schema_version = i.schema_version
     AND e.data = i.data) AS same
FROM unnest($1::uuid[], $3::text[], $4::integer[], $5::jsonb[]) AS i(event_id, event_type, schema_version, data)
JOIN {{schema}}.keiro_events e ON e.event_id = i.event_id
ORDER BY e.global_position`

const recordedColumnsE = `e.global_position, e.event_id, e.stream_name, e.stream_version, e.event_type,
    e.schema_version, e.data, e.metadata, e.correlation_id, e.causation_id, e.traceparent,
    e.tracestate, e.recorded_at`

// Stream reads page by stream version.
const (
	sqlReadStreamForward = `SELECT ` + recordedColumns + ` FROM {{schema}}.keiro_events
    WHERE stream_name = $1 AND stream_version > $2 ORDER BY stream_version LIMIT $3`
	sqlReadStreamBackward = `SELECT ` + recordedColumns + ` FROM {{schema}}.keiro_events
    WHERE stream_name = $1 AND stream_version < $2 ORDER BY stream_version DESC LIMIT $3`
)

// Log reads page by global position, up to an inclusive bound.
const (
	sqlReadAll = `SELECT ` + recordedColumns + ` FROM {{schema}}.keiro_events
    WHERE global_position > $1 AND global_position <= $2 ORDER BY global_position LIMIT $3`
	sqlReadCategory = `SELECT ` + recordedColumns + ` FROM {{schema}}.keiro_events
    WHERE category = $4 AND global_position > $1 AND global_position <= $2
    ORDER BY global_position LIMIT $3`
)

// sqlHead reads the newest global position (0 for an empty log).
const sqlHead = `SELECT coalesce(max(global_position), 0) FROM {{schema}}.keiro_events`

// sqlWriters selects the store's writers: the transactions (by virtual transaction id, which
// also names prepared ones) holding the lock every INSERT into keiro_events holds from before
// it draws a global position until its transaction ends. Only this store's table counts, so
// transactions elsewhere in the database or the cluster never hold a subscription back.
const sqlWriters = `SELECT l.virtualtransaction FROM pg_locks l
    WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock' AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.relation = '{{schema}}.keiro_events'::regclass`

// sqlHorizon reads the newest visible global position and which of the writers $2 (virtual
// transaction ids of pending fences, possibly none) still run; the lock table is not read when
// $2 is empty, so an idle poll costs one index probe. It also reads the subscription's stored
// checkpoint, so a Rebuild is noticed while idle, and whether an operator asked for dead
// letters to be replayed (a probe of a tiny partial index). It assigns no transaction id.
const sqlHorizon = `SELECT
    (SELECT coalesce(array_agg(DISTINCT w.virtualtransaction), '{}') FROM (` + sqlWriters + `
        AND cardinality($2::text[]) > 0 AND l.virtualtransaction = ANY($2::text[])) w),
    (SELECT coalesce(max(global_position), 0) FROM {{schema}}.keiro_events),
    (SELECT position FROM {{schema}}.keiro_subscriptions WHERE name = $1),
    EXISTS (SELECT 1 FROM {{schema}}.keiro_subscription_dead_letters WHERE subscription_name = $1 AND status = 'replay')`

// sqlFence reads the newest global position H visible in the statement's snapshot and, after
// that snapshot was taken, the store's writers. Every transaction that drew a position ≤ H
// held its writer's lock from before the draw; if it has not ended, it is among them. It
// assigns no transaction id.
const sqlFence = `SELECT (SELECT coalesce(max(global_position), 0) FROM {{schema}}.keiro_events),
    (SELECT coalesce(array_agg(DISTINCT w.virtualtransaction), '{}') FROM (` + sqlWriters + `) w)`

// Subscription checkpoints.
const (
	sqlSubscriptionEnsure = `INSERT INTO {{schema}}.keiro_subscriptions (name) VALUES ($1)
    ON CONFLICT (name) DO NOTHING`
	sqlSubscriptionLock = `SELECT position FROM {{schema}}.keiro_subscriptions WHERE name = $1 FOR UPDATE`
	sqlSubscriptionSave = `UPDATE {{schema}}.keiro_subscriptions SET position = $2, updated_at = now()
    WHERE name = $1`
	sqlSubscriptionPosition = `SELECT position FROM {{schema}}.keiro_subscriptions WHERE name = $1`
	// sqlSubscriptionReset also wakes the running instance (the NOTIFY is delivered at commit).
	sqlSubscriptionReset = `WITH reset AS (
    INSERT INTO {{schema}}.keiro_subscriptions AS s (name, position, rebuilt_at)
    VALUES ($1, $2, now())
    ON CONFLICT (name) DO UPDATE SET position = $2, rebuilt_at = now(), updated_at = now()
    RETURNING 1
)
SELECT pg_notify('{{channel}}', '') FROM reset`
)

// sqlSubscriptionAdvisoryLock takes the one-active-instance lock of subscription $1, keyed by
// schema and name (advisorylock.Subscription); sqlSubscriptionAdvisoryUnlock releases it.
var (
	sqlSubscriptionAdvisoryLock   = `SELECT pg_advisory_lock(` + advisorylock.Subscription(`'{{schema}}'`, `$1`) + `)`
	sqlSubscriptionAdvisoryUnlock = `SELECT pg_advisory_unlock(` + advisorylock.Subscription(`'{{schema}}'`, `$1`) + `)`
)

// Sharded subscriptions (shard.go, migration 013_subscription_shards.sql). The lease statements
// read the database's clock (clock_timestamp(), so that workers on several hosts agree) unless
// $at gives a time; leases are given in microseconds.
const (
	// sqlShardBucket is the bucket of stream $1 among $2: PostgreSQL's 64-bit text hash
	// (hashtextextended, the hash of hash partitioning) of the stream name, modulo $2.
	sqlShardBucket  = `SELECT ` + shardBucketExpr + ` FROM (SELECT $1::text AS stream_name, $2::bigint AS n) s`
	shardBucketExpr = `(((hashtextextended(stream_name, 0) % n) + n) % n)::integer`
	// sqlShardEnsure creates the subscription's bucket rows, unowned at checkpoint 0, unless
	// rows of another count exist, and returns the counts its rows were created with (one, $2,
	// unless they disagree).
	sqlShardEnsure = `WITH ins AS (
    INSERT INTO {{schema}}.keiro_subscription_shards (subscription_name, bucket, shard_count)
    SELECT $1, g, $2 FROM generate_series(0, $2 - 1) AS g
    WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.keiro_subscription_shards WHERE subscription_name = $1 AND shard_count <> $2)
    ON CONFLICT (subscription_name, bucket) DO NOTHING
    RETURNING shard_count
)
SELECT coalesce(array_agg(DISTINCT c ORDER BY c), '{}') FROM (
    SELECT shard_count AS c FROM {{schema}}.keiro_subscription_shards WHERE subscription_name = $1
    UNION SELECT shard_count FROM ins) x`
	// sqlShardJoin records worker $2 as a live member until $3 µs from now.
	sqlShardJoin = `INSERT INTO {{schema}}.keiro_subscription_shard_members AS m (subscription_name, worker_id, lease_expires_at)
    VALUES ($1, $2, coalesce($4::timestamptz, clock_timestamp()) + $3 * interval '1 microsecond')
    ON CONFLICT (subscription_name, worker_id) DO UPDATE SET lease_expires_at = excluded.lease_expires_at
    RETURNING (xmax = 0) AS joined`
	// sqlShardMembers deletes the members whose lease expired (skipping rows another worker's
	// pass holds) and returns the live ones, ordered: a worker's place in the order decides its
	// share.
	sqlShardMembers = `WITH gone AS (
    DELETE FROM {{schema}}.keiro_subscription_shard_members
    WHERE (subscription_name, worker_id) IN (
        SELECT subscription_name, worker_id FROM {{schema}}.keiro_subscription_shard_members
        WHERE subscription_name = $1 AND lease_expires_at < coalesce($2::timestamptz, clock_timestamp())
        FOR UPDATE SKIP LOCKED)
)
SELECT worker_id FROM {{schema}}.keiro_subscription_shard_members
WHERE subscription_name = $1 AND lease_expires_at >= coalesce($2::timestamptz, clock_timestamp())
ORDER BY worker_id`
	// sqlShardRenew extends every unexpired lease worker $2 holds by $3 µs and returns those
	// buckets and their checkpoints. An expired lease is not renewed: it is lost, and its
	// bucket is taken again through the claim like any other.
	sqlShardRenew = `UPDATE {{schema}}.keiro_subscription_shards AS s
    SET lease_expires_at = coalesce($4::timestamptz, clock_timestamp()) + $3 * interval '1 microsecond',
        heartbeat_at = coalesce($4::timestamptz, clock_timestamp()), updated_at = now()
    WHERE (s.subscription_name, s.bucket) IN (
        SELECT subscription_name, bucket FROM {{schema}}.keiro_subscription_shards
        WHERE subscription_name = $1 AND owner_worker_id = $2
          AND lease_expires_at > coalesce($4::timestamptz, clock_timestamp())
        ORDER BY bucket FOR UPDATE)
    RETURNING s.bucket, s.checkpoint`
	// sqlShardClaim takes up to $3 buckets that nobody holds or whose lease expired, lowest
	// first, for worker $2 until $4 µs from now. SKIP LOCKED is the exclusion: two workers never
	// take one bucket, and a bucket whose owner is inside a batch transaction (which holds the
	// row's lock) is not taken from under it.
	sqlShardClaim = `UPDATE {{schema}}.keiro_subscription_shards AS s
    SET owner_worker_id = $2,
        lease_expires_at = coalesce($5::timestamptz, clock_timestamp()) + $4 * interval '1 microsecond',
        heartbeat_at = coalesce($5::timestamptz, clock_timestamp()), updated_at = now()
    WHERE (s.subscription_name, s.bucket) IN (
        SELECT subscription_name, bucket FROM {{schema}}.keiro_subscription_shards
        WHERE subscription_name = $1
          AND (owner_worker_id IS NULL OR lease_expires_at < coalesce($5::timestamptz, clock_timestamp()))
        ORDER BY bucket LIMIT $3 FOR UPDATE SKIP LOCKED)
    RETURNING s.bucket, s.checkpoint`
	// sqlShardRelease gives up worker $2's buckets $3 (all of them when $3 is NULL), which any
	// worker may then take at once.
	sqlShardRelease = `UPDATE {{schema}}.keiro_subscription_shards
    SET owner_worker_id = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE subscription_name = $1 AND owner_worker_id = $2 AND ($3::integer[] IS NULL OR bucket = ANY($3::integer[]))
    RETURNING bucket`
	// sqlShardLeave deletes worker $2's membership.
	sqlShardLeave = `DELETE FROM {{schema}}.keiro_subscription_shard_members WHERE subscription_name = $1 AND worker_id = $2`
	// sqlShardNotify wakes the subscription's workers (at commit) to rebalance.
	sqlShardNotify = `SELECT pg_notify('{{channel}}', $1)`
	// sqlShardLock begins a bucket's batch: the row's lock, if worker $3 still holds an
	// unexpired lease on bucket $2.
	sqlShardLock = `SELECT checkpoint FROM {{schema}}.keiro_subscription_shards
    WHERE subscription_name = $1 AND bucket = $2 AND owner_worker_id = $3 AND lease_expires_at > clock_timestamp()
    FOR UPDATE`
	// sqlShardSave writes bucket $2's checkpoint if worker $3's lease is still unexpired at this
	// statement's time; a worker whose lease ran out during the batch writes nothing.
	sqlShardSave = `UPDATE {{schema}}.keiro_subscription_shards SET checkpoint = $4, updated_at = now()
    WHERE subscription_name = $1 AND bucket = $2 AND owner_worker_id = $3 AND lease_expires_at > clock_timestamp()`
	// sqlShardReset sets every bucket's checkpoint to 0 (Rebuild), locking the rows in bucket
	// order as renewals do, and wakes the workers.
	sqlShardReset = `WITH reset AS (
    UPDATE {{schema}}.keiro_subscription_shards AS s SET checkpoint = 0, updated_at = now()
    WHERE (s.subscription_name, s.bucket) IN (
        SELECT subscription_name, bucket FROM {{schema}}.keiro_subscription_shards
        WHERE subscription_name = $1 ORDER BY bucket FOR UPDATE)
    RETURNING 1
)
SELECT pg_notify('{{channel}}', $2) FROM (SELECT count(*) FROM reset) x`
	// sqlShardOwnership lists the subscription's buckets.
	sqlShardOwnership = `SELECT bucket, owner_worker_id, lease_expires_at, checkpoint,
        coalesce(lease_expires_at > clock_timestamp(), false)
    FROM {{schema}}.keiro_subscription_shards WHERE subscription_name = $1 ORDER BY bucket`
	// sqlShardHorizon is sqlHorizon for a sharded worker: which writers $2 still run, the head,
	// whether dead letters await a replay, the buckets worker $3 holds (by owner, expired or
	// not) with their checkpoints, how many members are live and how many buckets anyone may
	// take (nobody holds them or their lease expired). It writes nothing.
	sqlShardHorizon = `SELECT
    (SELECT coalesce(array_agg(DISTINCT w.virtualtransaction), '{}') FROM (` + sqlWriters + `
        AND cardinality($2::text[]) > 0 AND l.virtualtransaction = ANY($2::text[])) w),
    (SELECT coalesce(max(global_position), 0) FROM {{schema}}.keiro_events),
    EXISTS (SELECT 1 FROM {{schema}}.keiro_subscription_dead_letters WHERE subscription_name = $1 AND status = 'replay'),
    (SELECT coalesce(array_agg(bucket ORDER BY bucket), '{}') FROM {{schema}}.keiro_subscription_shards
        WHERE subscription_name = $1 AND owner_worker_id = $3),
    (SELECT coalesce(array_agg(checkpoint ORDER BY bucket), '{}') FROM {{schema}}.keiro_subscription_shards
        WHERE subscription_name = $1 AND owner_worker_id = $3),
    (SELECT count(*) FROM {{schema}}.keiro_subscription_shard_members
        WHERE subscription_name = $1 AND lease_expires_at >= clock_timestamp()),
    (SELECT count(*) FROM {{schema}}.keiro_subscription_shards
        WHERE subscription_name = $1 AND (owner_worker_id IS NULL OR lease_expires_at < clock_timestamp()))`
)

// Sharded log reads: one page of positions in (after, upTo] of the buckets $5 among $6, with
// each event's bucket.
const (
	sqlShardReadAll = `SELECT ` + recordedColumns + `, b.bucket FROM {{schema}}.keiro_events e
    CROSS JOIN LATERAL (SELECT ` + shardBucketExpr + ` AS bucket FROM (SELECT e.stream_name, $6::bigint AS n) s) b
    WHERE e.global_position > $1 AND e.global_position <= $2 AND b.bucket = ANY($5::integer[])
      AND $4::text = '' -- the category parameter of sqlShardReadCategory, typed so that both take the same arguments
    ORDER BY e.global_position LIMIT $3`
	sqlShardReadCategory = `SELECT ` + recordedColumns + `, b.bucket FROM {{schema}}.keiro_events e
    CROSS JOIN LATERAL (SELECT ` + shardBucketExpr + ` AS bucket FROM (SELECT e.stream_name, $6::bigint AS n) s) b
    WHERE e.category = $4 AND e.global_position > $1 AND e.global_position <= $2 AND b.bucket = ANY($5::integer[])
    ORDER BY e.global_position LIMIT $3`
)

// Subscription dead letters (deadletter.go).
const (
	deadLetterColumns = `dead_letter_id, subscription_name, global_position, event_id, stream_name,
    stream_version, event_type, error_class, error_text, attempts, status, dead_lettered_at, replayed_at`
	sqlDeadList = `SELECT ` + deadLetterColumns + ` FROM {{schema}}.keiro_subscription_dead_letters
    WHERE ($1 = '' OR subscription_name = $1) AND ($2 = '' OR status = $2) AND dead_letter_id > $3
    ORDER BY dead_letter_id LIMIT $4`
	// sqlDeadInsert parks an event; a later failure of the same event (after a Rebuild) updates
	// the row and adds its deliveries.
	sqlDeadInsert = `INSERT INTO {{schema}}.keiro_subscription_dead_letters AS d (subscription_name,
        global_position, event_id, stream_name, stream_version, event_type, error_class, error_text, attempts)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT (subscription_name, event_id) DO UPDATE SET status = 'dead', global_position = excluded.global_position,
        error_class = excluded.error_class, error_text = excluded.error_text, attempts = d.attempts + excluded.attempts,
        dead_lettered_at = now(), updated_at = now()`
	// sqlDeadRequest marks dead rows for replay and wakes the subscription (at commit).
	sqlDeadRequest = `WITH req AS (
    UPDATE {{schema}}.keiro_subscription_dead_letters
    SET status = 'replay', replay_requested_at = now(), updated_at = now()
    WHERE subscription_name = $1 AND status = 'dead' AND ($3::boolean OR dead_letter_id = ANY($2::bigint[]))
    RETURNING 1
), n AS (SELECT count(*) AS n FROM req),
notified AS (SELECT pg_notify('{{channel}}', '') FROM n WHERE n.n > 0)
SELECT n.n, (SELECT count(*) FROM notified) FROM n`
	sqlDeadNextReplay = `SELECT dead_letter_id, global_position FROM {{schema}}.keiro_subscription_dead_letters
    WHERE subscription_name = $1 AND status = 'replay' ORDER BY dead_letter_id LIMIT 1 FOR UPDATE SKIP LOCKED`
	sqlDeadReplayed = `UPDATE {{schema}}.keiro_subscription_dead_letters
    SET status = 'replayed', replayed_at = now(), attempts = attempts + 1, updated_at = now()
    WHERE dead_letter_id = $1`
	sqlDeadReplayFailed = `UPDATE {{schema}}.keiro_subscription_dead_letters
    SET status = 'dead', attempts = attempts + 1, error_class = $2, error_text = $3, updated_at = now()
    WHERE dead_letter_id = $1 AND status = 'replay'`
)

// The integration producer's mark (producer.go).
const (
	sqlProducerMark     = `SELECT coalesce((SELECT position FROM {{schema}}.keiro_producer_marks WHERE producer_name = $1), 0)`
	sqlProducerMarkSave = `INSERT INTO {{schema}}.keiro_producer_marks AS m (producer_name, position) VALUES ($1, $2)
    ON CONFLICT (producer_name) DO UPDATE SET position = greatest(m.position, excluded.position), updated_at = now()`
)

// Snapshots.
const (
	sqlSnapshotRead = `SELECT stream_version, state_version, state FROM {{schema}}.keiro_snapshots
    WHERE stream_name = $1`
	// sqlSnapshotWrite keeps the newest snapshot of a compatible state version; a different
	// state version replaces the row whatever its stream version (so a rollback can re-seed).
	sqlSnapshotWrite = `INSERT INTO {{schema}}.keiro_snapshots AS s (stream_name, stream_version, state_version, state)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (stream_name) DO UPDATE
    SET stream_version = excluded.stream_version, state_version = excluded.state_version,
        state = excluded.state, updated_at = now()
    WHERE s.stream_version <= excluded.stream_version OR s.state_version <> excluded.state_version`
)

// sqlEventIn is the point lookup routers and process managers make before dispatching a
// command (dispatch.go): is its deterministic id already in the target stream?
const sqlEventIn = `SELECT EXISTS (SELECT 1 FROM {{schema}}.keiro_events WHERE event_id = $1 AND stream_name = $2)`

// Dispatch dead letters (dispatchpolicy.go, migration 010_timers.sql). A redelivered input
// records nothing new.
const (
	sqlDispatchDeadInsert = `INSERT INTO {{schema}}.keiro_dispatch_dead_letters (dispatcher_kind, dispatcher_name,
        correlation_id, source_event_id, source_global_position, emit_index, target_stream_name, command_id,
        error_class, error_detail)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT (dispatcher_name, source_event_id, emit_index) DO NOTHING`
	sqlDispatchDeadList = `SELECT dead_letter_id, dispatcher_kind, dispatcher_name, correlation_id, source_event_id,
        source_global_position, emit_index, target_stream_name, command_id, error_class, error_detail, created_at
    FROM {{schema}}.keiro_dispatch_dead_letters
    WHERE $1 = '' OR dispatcher_name = $1
    ORDER BY created_at DESC, dead_letter_id DESC LIMIT $2`
)

// Durable timers (timer.go, migration 010_timers.sql). The worker's statements take the
// worker's clock as a parameter ($now), so one clock decides due, stale and updated_at.
const (
	timerColumns = `timer_id, process_manager_name, correlation_id, fire_at, payload, status, attempts,
    fired_event_id, coalesce(last_error, ''), created_at, updated_at`
	// sqlTimerSchedule arms a timer, or re-arms it (new fire time and payload) while it is still
	// scheduled; a firing or terminal timer is left alone. It returns a row when it wrote one.
	sqlTimerSchedule = `INSERT INTO {{schema}}.keiro_timers AS t (timer_id, process_manager_name, correlation_id, fire_at, payload)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (timer_id) DO UPDATE SET fire_at = excluded.fire_at, payload = excluded.payload, updated_at = now()
    WHERE t.status = 'scheduled'
    RETURNING timer_id`
	// sqlTimerScheduleOnce arms a timer unless one with its id exists: the first arm wins.
	sqlTimerScheduleOnce = `INSERT INTO {{schema}}.keiro_timers (timer_id, process_manager_name, correlation_id, fire_at, payload)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (timer_id) DO NOTHING
    RETURNING timer_id`
	sqlTimerCancel = `UPDATE {{schema}}.keiro_timers SET status = 'cancelled', updated_at = now()
    WHERE timer_id = $1 AND status IN ('scheduled', 'firing')`
	sqlTimerGet = `SELECT ` + timerColumns + ` FROM {{schema}}.keiro_timers WHERE timer_id = $1`
	// sqlTimerClaim moves the $2 earliest due scheduled timers to firing and counts their
	// attempt, skipping rows another worker's claim holds. It runs on its own, so once it
	// commits the other workers skip the rows (they are firing) while this one fires them.
	sqlTimerClaim = `UPDATE {{schema}}.keiro_timers AS t SET status = 'firing', attempts = t.attempts + 1, updated_at = $1
    WHERE t.timer_id IN (
        SELECT timer_id FROM {{schema}}.keiro_timers
        WHERE status = 'scheduled' AND fire_at <= $1
        ORDER BY fire_at, timer_id LIMIT $2 FOR UPDATE SKIP LOCKED)
      AND t.status = 'scheduled'
    RETURNING ` + timerColumns + `
    `
	// sqlTimerRelease gives back claimed timers a stopping worker did not fire: scheduled
	// again, the attempt refunded. Each row is fenced by its claim's attempt.
	sqlTimerRelease = `UPDATE {{schema}}.keiro_timers AS t SET status = 'scheduled', attempts = t.attempts - 1, updated_at = now()
    FROM unnest($1::uuid[], $2::bigint[]) AS c(timer_id, attempts)
    WHERE t.timer_id = c.timer_id AND t.attempts = c.attempts AND t.status = 'firing'`
	// sqlTimerFired ends a firing timer in the fire's transaction, fenced by the attempt that
	// claimed it: a worker whose claim was requeued and claimed again cannot mark the newer
	// attempt, and its effect rolls back.
	sqlTimerFired = `UPDATE {{schema}}.keiro_timers SET status = 'fired', fired_event_id = $3, last_error = NULL, updated_at = now()
    WHERE timer_id = $1 AND status = 'firing' AND attempts = $2`
	// sqlTimerFailed records a failed fire; the timer stays firing until it is requeued.
	sqlTimerFailed = `UPDATE {{schema}}.keiro_timers SET last_error = $3
    WHERE timer_id = $1 AND status = 'firing' AND attempts = $2`
	sqlTimerDead = `UPDATE {{schema}}.keiro_timers SET status = 'dead', last_error = $2, updated_at = now()
    WHERE timer_id = $1 AND status IN ('scheduled', 'firing')`
	// sqlTimerRequeueStale puts back the firing timers last touched at or before $1 (the
	// worker's clock minus the requeue age); fire_at is kept. It returns how many it moved.
	sqlTimerRequeueStale = `UPDATE {{schema}}.keiro_timers SET status = 'scheduled', updated_at = now()
    WHERE status = 'firing' AND updated_at <= $1`
	sqlTimerRequeue = `UPDATE {{schema}}.keiro_timers SET status = 'scheduled', updated_at = now()
    WHERE timer_id = $1 AND status = 'firing'`
	sqlTimerStuck = `SELECT ` + timerColumns + ` FROM {{schema}}.keiro_timers
    WHERE status = 'firing' AND updated_at <= $1 AND attempts >= $2
    ORDER BY updated_at, timer_id LIMIT $3`
	// sqlTimerGauges counts the due backlog and the firing timers in one pass over the index.
	sqlTimerGauges = `SELECT count(*) FILTER (WHERE status = 'scheduled' AND fire_at <= $1),
        count(*) FILTER (WHERE status = 'firing')
    FROM {{schema}}.keiro_timers WHERE status IN ('scheduled', 'firing')`
)

// Read models (readmodel.go, migration 017_read_models.sql).
const (
	// sqlReadModelRegister inserts a live registry row unless one exists, and returns the row
	// it inserted; an existing row is neither returned (the statement's snapshot may predate a
	// concurrent registration) nor written: the caller reads it with sqlReadModelLookup.
	sqlReadModelRegister = `INSERT INTO {{schema}}.keiro_read_models (name, version, shape_hash, status, last_built_at)
    VALUES ($1, $2, $3, 'live', now())
    ON CONFLICT (name) DO NOTHING
    RETURNING name, version, shape_hash, status, last_built_at, updated_at, xmin::text`
	// sqlReadModelLookup reads a registry row without locking or writing it; xmin identifies
	// the row version, so a query can tell whether the row changed while it ran.
	sqlReadModelLookup = `SELECT name, version, shape_hash, status, last_built_at, updated_at, xmin::text
    FROM {{schema}}.keiro_read_models WHERE name = $1`
	// sqlReadModelTransition sets a model's schema identity and status, creating the row if
	// needed; last_built_at moves only on a transition to live.
	sqlReadModelTransition = `INSERT INTO {{schema}}.keiro_read_models AS m (name, version, shape_hash, status, last_built_at)
    VALUES ($1, $2, $3, $4, CASE WHEN $4 = 'live' THEN now() END)
    ON CONFLICT (name) DO UPDATE SET version = excluded.version, shape_hash = excluded.shape_hash,
        status = excluded.status,
        last_built_at = CASE WHEN excluded.status = 'live' THEN now() ELSE m.last_built_at END,
        updated_at = now()
    RETURNING name, version, shape_hash, status, last_built_at, updated_at, xmin::text`
	// sqlReadModelFence reads a model's status under a share lock held to the end of the
	// applier's transaction: a rebuild's status change waits for it, and it waits for a rebuild
	// in progress.
	sqlReadModelFence = `SELECT status FROM {{schema}}.keiro_read_models WHERE name = $1 FOR SHARE`
	// sqlProjectionDedupInsert records that projection $1 applied key $2; no row: it already had.
	sqlProjectionDedupInsert = `INSERT INTO {{schema}}.keiro_projection_dedup (projection_name, event_id)
    VALUES ($1, $2) ON CONFLICT (projection_name, event_id) DO NOTHING`
	sqlProjectionDedupDelete = `DELETE FROM {{schema}}.keiro_projection_dedup WHERE projection_name = ANY($1)`
	sqlProjectionDedupCount  = `SELECT count(*) FROM {{schema}}.keiro_projection_dedup WHERE projection_name = ANY($1)`
	sqlProjectionDedupPrune  = `DELETE FROM {{schema}}.keiro_projection_dedup WHERE applied_at < $1`
	// sqlCategoryHead reads the newest global position of category $1 (0 if none), on the
	// (category, global_position) index.
	sqlCategoryHead = `SELECT coalesce(max(global_position), 0) FROM {{schema}}.keiro_events WHERE category = $1`
	// sqlSubscriptionProgress reads how far subscription $1 has applied the log: its checkpoint,
	// or for a sharded subscription the minimum over its buckets (0 when it has no row yet), and
	// how many buckets still have an event of theirs (of category $3, '' for all) at or below
	// target $2 after their checkpoint. A bucket's checkpoint moves only when the bucket has
	// events, so a quiet bucket below the target does not hold a wait back.
	sqlSubscriptionProgress = `WITH shards AS (
    SELECT bucket, shard_count, checkpoint FROM {{schema}}.keiro_subscription_shards WHERE subscription_name = $1
)
SELECT
    coalesce((SELECT min(checkpoint) FROM shards),
             (SELECT position FROM {{schema}}.keiro_subscriptions WHERE name = $1), 0),
    EXISTS (SELECT 1 FROM shards),
    (SELECT count(*) FROM shards s WHERE s.checkpoint < $2 AND EXISTS (
        SELECT 1 FROM {{schema}}.keiro_events e
        WHERE e.global_position > s.checkpoint AND e.global_position <= $2
          AND ($3 = '' OR e.category = $3)
          AND (SELECT ` + shardBucketExpr + ` FROM (SELECT e.stream_name, s.shard_count::bigint AS n) b) = s.bucket))`
	// sqlSubscriptionRewind moves subscription $1's checkpoint, or every bucket's of a sharded
	// one (locked in bucket order, as the workers do), to $2, and wakes the running instances
	// (the NOTIFYs are delivered at commit).
	sqlSubscriptionRewind = `WITH plain AS (
    UPDATE {{schema}}.keiro_subscriptions SET position = $2, rebuilt_at = now(), updated_at = now()
    WHERE name = $1
    RETURNING 1
), shards AS (
    UPDATE {{schema}}.keiro_subscription_shards AS s SET checkpoint = $2, updated_at = now()
    WHERE (s.subscription_name, s.bucket) IN (
        SELECT subscription_name, bucket FROM {{schema}}.keiro_subscription_shards
        WHERE subscription_name = $1 ORDER BY bucket FOR UPDATE)
    RETURNING 1
)
SELECT pg_notify('{{channel}}', ''), pg_notify('{{channel}}', 'keiro.shards:' || $1)
FROM (SELECT (SELECT count(*) FROM plain) + (SELECT count(*) FROM shards) AS n) x`
)

// queries holds the statements with the schema substituted.
type queries struct {
	streamAny, streamNoStream, streamExists, streamExact string
	oneAny, oneNoStream, oneExists, oneExact             string
	streamVersion, existingIDs                           string
	readStreamForward, readStreamBackward                string
	readAll, readCategory, head, fence, horizon          string
	subEnsure, subLock, subSave, subPosition, subReset   string
	subAdvisoryLock, subAdvisoryUnlock                   string
	snapshotRead, snapshotWrite                          string
	deadList, deadInsert, deadRequest                    string
	deadNextReplay, deadReplayed, deadReplayFailed       string
	producerMark, producerMarkSave                       string
	eventIn, dispatchDeadInsert, dispatchDeadList        string
	timerSchedule, timerScheduleOnce, timerCancel        string
	timerGet, timerClaim, timerFired, timerFailed        string
	timerDead, timerRequeueStale, timerRequeue           string
	timerStuck, timerGauges, timerRelease                string
	shardBucket, shardEnsure, shardJoin, shardMembers    string
	shardRenew, shardClaim, shardRelease, shardLeave     string
	shardNotify, shardLock, shardSave, shardReset        string
	shardOwnership, shardHorizon                         string
	shardReadAll, shardReadCategory                      string
	rmRegister, rmLookup, rmTransition, rmFence          string
	dedupInsert, dedupDelete, dedupCount, dedupPrune     string
	categoryHead, subProgress, subRewind                 string
}

func newQueries(schema, channel string) queries {
	r := func(q string) string { return pgtext.Expand(q, "schema", schema, "channel", channel) }
	tail, tailOne := r(sqlAppendTail), r(sqlAppendTailOne)
	cte := func(s string) string { return "WITH s AS (" + r(s) + ")" + tail }
	one := func(s string) string { return "WITH s AS (" + r(s) + ")" + tailOne }
	return queries{
		oneAny:             one(sqlStreamAny),
		oneNoStream:        one(sqlStreamNoStream),
		oneExists:          one(sqlStreamExists),
		oneExact:           one(sqlStreamExact),
		streamAny:          cte(sqlStreamAny),
		streamNoStream:     cte(sqlStreamNoStream),
		streamExists:       cte(sqlStreamExists),
		streamExact:        cte(sqlStreamExact),
		streamVersion:      r(sqlStreamVersion),
		existingIDs:        r(sqlExistingIDs),
		readStreamForward:  r(sqlReadStreamForward),
		readStreamBackward: r(sqlReadStreamBackward),
		readAll:            r(sqlReadAll),
		readCategory:       r(sqlReadCategory),
		head:               r(sqlHead),
		fence:              r(sqlFence),
		horizon:            r(sqlHorizon),
		subEnsure:          r(sqlSubscriptionEnsure),
		subLock:            r(sqlSubscriptionLock),
		subSave:            r(sqlSubscriptionSave),
		subPosition:        r(sqlSubscriptionPosition),
		subReset:           r(sqlSubscriptionReset),
		subAdvisoryLock:    r(sqlSubscriptionAdvisoryLock),
		subAdvisoryUnlock:  r(sqlSubscriptionAdvisoryUnlock),
		snapshotRead:       r(sqlSnapshotRead),
		snapshotWrite:      r(sqlSnapshotWrite),
		deadList:           r(sqlDeadList),
		deadInsert:         r(sqlDeadInsert),
		deadRequest:        r(sqlDeadRequest),
		deadNextReplay:     r(sqlDeadNextReplay),
		deadReplayed:       r(sqlDeadReplayed),
		deadReplayFailed:   r(sqlDeadReplayFailed),
		producerMark:       r(sqlProducerMark),
		producerMarkSave:   r(sqlProducerMarkSave),
		eventIn:            r(sqlEventIn),
		dispatchDeadInsert: r(sqlDispatchDeadInsert),
		dispatchDeadList:   r(sqlDispatchDeadList),
		timerSchedule:      r(sqlTimerSchedule),
		timerScheduleOnce:  r(sqlTimerScheduleOnce),
		timerCancel:        r(sqlTimerCancel),
		timerGet:           r(sqlTimerGet),
		timerClaim:         r(sqlTimerClaim),
		timerFired:         r(sqlTimerFired),
		timerFailed:        r(sqlTimerFailed),
		timerDead:          r(sqlTimerDead),
		timerRequeueStale:  r(sqlTimerRequeueStale),
		timerRequeue:       r(sqlTimerRequeue),
		timerStuck:         r(sqlTimerStuck),
		timerGauges:        r(sqlTimerGauges),
		timerRelease:       r(sqlTimerRelease),
		shardBucket:        r(sqlShardBucket),
		shardEnsure:        r(sqlShardEnsure),
		shardJoin:          r(sqlShardJoin),
		shardMembers:       r(sqlShardMembers),
		shardRenew:         r(sqlShardRenew),
		shardClaim:         r(sqlShardClaim),
		shardRelease:       r(sqlShardRelease),
		shardLeave:         r(sqlShardLeave),
		shardNotify:        r(sqlShardNotify),
		shardLock:          r(sqlShardLock),
		shardSave:          r(sqlShardSave),
		shardReset:         r(sqlShardReset),
		shardOwnership:     r(sqlShardOwnership),
		shardHorizon:       r(sqlShardHorizon),
		shardReadAll:       r(sqlShardReadAll),
		shardReadCategory:  r(sqlShardReadCategory),
		rmRegister:         r(sqlReadModelRegister),
		rmLookup:           r(sqlReadModelLookup),
		rmTransition:       r(sqlReadModelTransition),
		rmFence:            r(sqlReadModelFence),
		dedupInsert:        r(sqlProjectionDedupInsert),
		dedupDelete:        r(sqlProjectionDedupDelete),
		dedupCount:         r(sqlProjectionDedupCount),
		dedupPrune:         r(sqlProjectionDedupPrune),
		categoryHead:       r(sqlCategoryHead),
		subProgress:        r(sqlSubscriptionProgress),
		subRewind:          r(sqlSubscriptionRewind),
	}
}
