package sqlq

// The inspection listings' SQL (outbox/list.go). Same rules as sql.go: tables through {{schema}},
// replaced with a validated schema name, never user input.

// sqlListOutbox lists rows after seq $1, of the statuses $2 in the phases $7, of source $3,
// destination $4 and key $5 (NULL: any), archived ($8 true) or not, at most $6, in seq order,
// with at most $9 bytes of each payload (pgtext.PrefixSQL). An operator listing: without
// statuses it scans the table (sent rows included).
const sqlListOutbox = `SELECT ` + RowColumns + ` FROM {{schema}}.keiro_outbox
WHERE seq > $1 AND ($2::text[] IS NULL OR (status = ANY($2) AND phase = ANY($7::smallint[])))
  AND ($3::text IS NULL OR source = $3) AND ($4::text IS NULL OR destination = $4)
  AND ($5::text IS NULL OR message_key = $5) AND (archived_at IS NOT NULL) = $8
ORDER BY seq LIMIT $6`

// sqlSearchOutbox lists the rows whose message id, key, event type or source is $1, newest
// first, at most $2, with at most $3 bytes of each payload (Admin.SearchOutbox). An operator's search: it scans the table, retained
// sent rows included.
const sqlSearchOutbox = `SELECT ` + RowColumns + ` FROM {{schema}}.keiro_outbox
WHERE message_id = $1 OR message_key = $1 OR event_type = $1 OR source = $1
ORDER BY seq DESC LIMIT $2`

// sqlListOutboxNewest is sqlListOutbox newest first: rows before seq $1 (0: from the newest).
const sqlListOutboxNewest = `SELECT ` + RowColumns + ` FROM {{schema}}.keiro_outbox
WHERE ($1::bigint = 0 OR seq < $1) AND ($2::text[] IS NULL OR (status = ANY($2) AND phase = ANY($7::smallint[])))
  AND ($3::text IS NULL OR source = $3) AND ($4::text IS NULL OR destination = $4)
  AND ($5::text IS NULL OR message_key = $5) AND (archived_at IS NOT NULL) = $8
ORDER BY seq DESC LIMIT $6`

// sqlCountDead counts the dead and rejected rows of source $1 and destination $2 (NULL: any)
// that are not archived.
const sqlCountDead = `SELECT count(*) FROM {{schema}}.keiro_outbox
WHERE phase = 2 AND archived_at IS NULL
  AND ($1::text IS NULL OR source = $1) AND ($2::text IS NULL OR destination = $2)`

// sqlAttemptErrors reads row $1's failed attempts (NULL: none recorded).
const sqlAttemptErrors = `SELECT attempt_errors FROM {{schema}}.keiro_outbox WHERE outbox_id = $1`

// sqlArchive archives the dead and rejected rows among the ids $1 that are not archived yet,
// and returns their ids in seq order.
const sqlArchive = `
WITH moved AS (
UPDATE {{schema}}.keiro_outbox SET archived_at = now()
WHERE phase = 2 AND archived_at IS NULL AND outbox_id = ANY($1::uuid[])
RETURNING outbox_id, seq)
SELECT outbox_id FROM moved ORDER BY seq`

// sqlListStuckOutbox lists rows claimed (publishing) more than $1 microseconds ago, oldest
// claim first, at most $2: through the claim index (phase 0 holds only open rows).
const sqlListStuckOutbox = `SELECT ` + RowColumns + ` FROM {{schema}}.keiro_outbox
WHERE phase = 0 AND status = 'publishing' AND updated_at < now() - $1::bigint * interval '1 microsecond'
ORDER BY updated_at, seq LIMIT $2`

// sqlListSentGcCandidates lists sent rows published more than $1 microseconds ago, oldest
// first, at most $2: the rows the next retention pass deletes, through the sent_gc index.
const sqlListSentGcCandidates = `SELECT ` + RowColumns + ` FROM {{schema}}.keiro_outbox
WHERE phase = 1 AND published_at < now() - $1::bigint * interval '1 microsecond'
ORDER BY published_at LIMIT $2`

// sqlActivity counts, per minute from $1 up to $2, rows published (true, by published_at,
// through the sent_gc index) and rows gone dead or rejected (false, by the updated_at of
// phase 2 rows).
const sqlActivity = `SELECT true, date_bin('1 minute', published_at, $1::timestamptz), count(*)
FROM {{schema}}.keiro_outbox WHERE phase = 1 AND published_at >= $1 AND published_at < $2 GROUP BY 2
UNION ALL
SELECT false, date_bin('1 minute', updated_at, $1::timestamptz), count(*)
FROM {{schema}}.keiro_outbox WHERE phase = 2 AND updated_at >= $1 AND updated_at < $2 GROUP BY 2`
