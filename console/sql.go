package console

import "strings"

// The console's read queries over keiro's tables ({{t}} is the schema-qualified table). The
// inbox's rows are read by the inbox package (inbox.Store: CountByConsumer, Activity,
// ListFailed, Lookup), as are the actions on either table.
const (
	// sqlOutboxCounts counts rows per destination and status, with the oldest pending or
	// failed row's creation time. It scans the table, as `relay status` does.
	sqlOutboxCounts = `
SELECT destination, status, count(*), min(created_at) FILTER (WHERE status IN ('pending', 'failed'))
FROM {{t}} GROUP BY destination, status ORDER BY destination, status`

	// sqlOutboxRecent counts rows published and rows gone dead or rejected in the last
	// minute (the partial indexes on published_at and on phase 2 keep it small), the relay
	// processes of the schema connected to the database (application_name starting with $1,
	// see outbox.ApplicationName), the database's clock, and the
	// first minute of the hour-long chart.
	sqlOutboxRecent = `
SELECT (SELECT count(*) FROM {{t}} WHERE phase = 1 AND published_at >= now() - interval '1 minute'),
       (SELECT count(*) FROM {{t}} WHERE phase = 2 AND updated_at >= now() - interval '1 minute'),
       (SELECT count(DISTINCT application_name) FROM pg_stat_activity
         WHERE datname = current_database() AND starts_with(application_name, $1)),
       now(), date_trunc('minute', now()) - interval '59 minutes'`

	// sqlOutboxRates buckets the last hour per minute from $1: rows published (published_at)
	// and rows that went dead or rejected (updated_at of phase 2 rows).
	sqlOutboxRates = `
SELECT 'sent', date_bin('1 minute', published_at, $1::timestamptz), count(*)
FROM {{t}} WHERE phase = 1 AND published_at >= $1 GROUP BY 2
UNION ALL
SELECT 'failed', date_bin('1 minute', updated_at, $1::timestamptz), count(*)
FROM {{t}} WHERE phase = 2 AND updated_at >= $1 GROUP BY 2`

	// sqlOutboxRows lists rows of the statuses $1 (and phases $7, for the partial indexes),
	// optionally of one source ($2) and destination ($3), before seq $4 (0: from the newest),
	// newest first, at most $5, with the first $6 payload bytes.
	sqlOutboxRows = `
SELECT seq, outbox_id, source, message_id, destination, message_key, event_type, schema_version,
    content_type, schema_registry, schema_subject, schema_version_ref, schema_id,
    schema_fingerprint, source_event_id, source_global_position, causation_id, correlation_id,
    traceparent, tracestate, substring(payload_bytes FROM 1 FOR $6), octet_length(payload_bytes),
    attributes::text, occurred_at, status, attempt_count, next_attempt_at, coalesce(last_error, ''),
    coalesce(rejection_code, ''), created_at, updated_at
FROM {{t}}
WHERE phase = ANY($7::smallint[]) AND status = ANY($1::text[])
  AND ($2::text IS NULL OR source = $2) AND ($3::text IS NULL OR destination = $3)
  AND ($4::bigint = 0 OR seq < $4)
ORDER BY seq DESC
LIMIT $5`

	// sqlOutboxCountDead counts the dead and rejected rows a filter requeue would move.
	sqlOutboxCountDead = `
SELECT count(*) FROM {{t}}
WHERE phase = 2 AND ($1::text IS NULL OR source = $1) AND ($2::text IS NULL OR destination = $2)`

	// sqlInboxRecent is the database's clock and the first minute of the hour-long chart.
	sqlInboxRecent = `SELECT now(), date_trunc('minute', now()) - interval '59 minutes'`

	// sqlSubscriptions lists the event store's subscriptions and their checkpoints.
	sqlSubscriptions = `
SELECT name, position, updated_at, rebuilt_at FROM {{t}} ORDER BY name LIMIT $1`
)

// bind substitutes the schema-qualified table (the schema is validated by the config).
func bind(q, schema, table string) string {
	return strings.ReplaceAll(q, "{{t}}", schema+"."+table)
}
