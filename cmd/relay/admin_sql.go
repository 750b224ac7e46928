package main

// SQL of the operator commands. Each statement has a %[1]s placeholder for the schema, which
// migrations.ValidateSchema checked (a plain lowercase identifier), so it is safe in SQL text.

// sqlStatusCounts counts rows per destination and status.
const sqlStatusCounts = `
SELECT destination, status, count(*)
FROM %[1]s.keiro_outbox
GROUP BY destination, status
ORDER BY destination, status`

// sqlOldestPending is the age in seconds of the oldest row still to be published (pending or
// failed, that is waiting for a retry), NULL when there is none. It uses the claim index.
const sqlOldestPending = `
SELECT extract(epoch FROM now() - min(created_at))::float8
FROM %[1]s.keiro_outbox
WHERE status IN ('pending', 'failed', 'publishing')`

// sqlDeadList lists dead and rejected rows oldest first, optionally filtered.
const sqlDeadList = `
SELECT outbox_id::text, seq, source, destination, message_id, message_key, event_type, status,
       attempt_count, coalesce(last_error, ''), coalesce(rejection_code, ''), created_at, updated_at
FROM %[1]s.keiro_outbox
WHERE status IN ('dead', 'rejected')
  AND ($1::text IS NULL OR source = $1)
  AND ($2::text IS NULL OR destination = $2)
ORDER BY seq
LIMIT $3`

// sqlRequeue makes dead and rejected rows pending again, fresh: no attempts, no claim, due now.
// last_error is kept as history until the next attempt overwrites it. Rows are selected by id
// ($1, NULL for any), source ($2) and destination ($3); only dead and rejected rows change.
const sqlRequeue = `
UPDATE %[1]s.keiro_outbox
SET status = 'pending', attempt_count = 0, next_attempt_at = now(), claim_token = NULL,
    lease_until = NULL, rejected_at = NULL, rejection_code = NULL, updated_at = now()
WHERE status IN ('dead', 'rejected')
  AND ($1::uuid[] IS NULL OR outbox_id = ANY($1))
  AND ($2::text IS NULL OR source = $2)
  AND ($3::text IS NULL OR destination = $3)
RETURNING outbox_id::text`

// sqlNotify wakes listening relays after a requeue.
const sqlNotify = `SELECT pg_notify($1, '')`
