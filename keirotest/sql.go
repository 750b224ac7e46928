package keirotest

// SQL of the kit, in one place. Schema names are validated (migrations.ValidateSchema) before
// they are placed into statements.

// sqlTableExists reports whether the qualified table $1 exists.
const sqlTableExists = `SELECT to_regclass($1) IS NOT NULL`

// sqlOutboxIDs lists a schema's outbox ids in seq order (format with the schema).
const sqlOutboxIDs = `SELECT outbox_id FROM %s.keiro_outbox ORDER BY seq`

// sqlNow reads the database clock.
const sqlNow = `SELECT clock_timestamp()`

// sqlOpenRows lists the rows a relay has yet to publish, optionally only for destinations $1
// (format with the schema).
const sqlOpenRows = `SELECT outbox_id FROM %s.keiro_outbox
WHERE status IN ('pending', 'failed', 'publishing') AND (cardinality($1::text[]) = 0 OR destination = ANY($1))
ORDER BY seq`

// sqlCountOpen counts those rows.
const sqlCountOpen = `SELECT count(*) FROM %s.keiro_outbox
WHERE status IN ('pending', 'failed', 'publishing') AND (cardinality($1::text[]) = 0 OR destination = ANY($1))`

// sqlChangedSince lists the rows that reached one of statuses $2 since $1 (format with the
// schema).
const sqlChangedSince = `SELECT outbox_id FROM %s.keiro_outbox
WHERE status = ANY($2) AND updated_at >= $1 ORDER BY seq`

// sqlInboxRows lists a consumer's inbox rows ($1), optionally only those of message id $2,
// oldest first, with what the kit's statuses are made of (format with the schema).
const sqlInboxRows = `SELECT source, dedupe_key, coalesce(message_id, ''), coalesce(event_type, ''), status,
	attempt_count, poisoned, dead_lettered_at IS NOT NULL, coalesce(last_error, '')
FROM %s.keiro_inbox
WHERE consumer = $1 AND ($2 = '' OR message_id = $2)
ORDER BY received_at, source, dedupe_key`

// sqlInboxConsumers lists the consumers with rows in an inbox (format with the schema).
const sqlInboxConsumers = `SELECT DISTINCT consumer FROM %s.keiro_inbox ORDER BY consumer`
