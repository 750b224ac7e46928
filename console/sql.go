package console

import "strings"

// The console's read queries over keiro's tables ({{t}} is the schema-qualified table). The
// rows and their counts are read by their packages (outbox.Store: Status, Activity,
// ListOutbox, Lookup, CountDead; inbox.Store: CountByConsumer, Activity, ListFailed, Lookup),
// as are the actions on either table.
const (
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

// Failure groups: the dead or rejected outbox rows, and one consumer's failed inbox rows, archived
// rows aside,
// grouped by error class and normalised message. {{norm}} is the normalisation of last_error:
// UUIDs become <id>, runs of 16 or more hex digits <hex>, and whole numbers <n> (an id, an
// offset, an amount), so that "order 41 …" and "order 42 …" fall in one group; the result is cut
// to 500 characters.
const (
	sqlNormalisedError = `left(regexp_replace(regexp_replace(regexp_replace(coalesce(last_error, ''),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
    '\m[0-9a-fA-F]{16,}\M', '<hex>', 'g'),
    '\m[0-9]+(\.[0-9]+)?\M', '<n>', 'g'), 500)`

	// sqlOutboxClass is an outbox row's error class: dead, or rejected and its code.
	sqlOutboxClass = `CASE status WHEN 'rejected' THEN 'rejected: ' || rejection_code ELSE status END`

	// sqlOutboxGroups lists the groups of dead and rejected rows, largest first.
	sqlOutboxGroups = `
SELECT class, message, count(*), min(updated_at), max(updated_at), min(last_error),
       (array_agg(DISTINCT destination ORDER BY destination))[1:5],
       (array_agg(DISTINCT event_type ORDER BY event_type))[1:5]
  FROM (SELECT {{class}} AS class, {{norm}} AS message, updated_at, coalesce(last_error, '') AS last_error,
               destination, event_type
          FROM {{t}} WHERE phase = 2 AND archived_at IS NULL) g
 GROUP BY class, message
 ORDER BY count(*) DESC, class, message
 LIMIT $1`

	// sqlOutboxGroupIDs lists the outbox ids of one group, newest first.
	sqlOutboxGroupIDs = `
SELECT outbox_id FROM (SELECT outbox_id, updated_at, {{class}} AS class, {{norm}} AS message
                         FROM {{t}} WHERE phase = 2 AND archived_at IS NULL) g
 WHERE class = $1 AND message = $2
 ORDER BY updated_at DESC
 LIMIT $3`

	// sqlInboxClass is a failed inbox row's error class.
	sqlInboxClass = `CASE WHEN poisoned THEN 'poisoned' ELSE 'retrying' END`

	// sqlInboxGroups lists the groups of consumer $1's failed rows, largest first.
	sqlInboxGroups = `
SELECT class, message, count(*), min(failed_at), max(failed_at), min(last_error),
       (array_agg(DISTINCT source ORDER BY source))[1:5],
       (array_agg(DISTINCT coalesce(event_type, '') ORDER BY coalesce(event_type, '')))[1:5]
  FROM (SELECT {{class}} AS class, {{norm}} AS message, failed_at, coalesce(last_error, '') AS last_error,
               source, event_type
          FROM {{t}} WHERE consumer = $1 AND status = 'failed' AND archived_at IS NULL) g
 GROUP BY class, message
 ORDER BY count(*) DESC, class, message
 LIMIT $2`

	// sqlInboxGroupKeys lists the keys of one group of consumer $1, oldest failure first.
	sqlInboxGroupKeys = `
SELECT source, dedupe_key FROM (SELECT source, dedupe_key, failed_at, {{class}} AS class, {{norm}} AS message
                                  FROM {{t}} WHERE consumer = $1 AND status = 'failed' AND archived_at IS NULL) g
 WHERE class = $2 AND message = $3
 ORDER BY failed_at, source, dedupe_key
 LIMIT $4`
)

// bindGroup is bind for the failure-group statements: class is the table's class expression.
func bindGroup(q, schema, table, class string) string {
	q = strings.ReplaceAll(q, "{{class}}", class)
	return bind(strings.ReplaceAll(q, "{{norm}}", sqlNormalisedError), schema, table)
}
