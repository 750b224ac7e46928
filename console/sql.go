package console

import "github.com/keiro-go/keiro/internal/pgtext"

// The console's read queries over keiro's tables ({{t}} is the schema-qualified table). The
// rows, their counts and their failure groups are read by their packages (outbox.Store: Status,
// Activity, ListOutbox, Lookup, CountDead, FailureGroups, FailureGroupIDs; inbox.Store:
// CountByConsumer, Activity, ListFailed, Lookup, FailureGroups, FailureGroupKeys), as are the
// actions on either table.
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
	return pgtext.Expand(q, "t", schema+"."+table)
}
