package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/inbox/handlers"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// sqlFixture creates in schema a table of effects and apply_event(doc jsonb), which raises
// KP001 (poison) while ctl.fail is true and otherwise records doc's message id and amount.
func sqlFixture(t *testing.T, db *testenv.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE TABLE %[1]s.ctl (fail boolean NOT NULL);
INSERT INTO %[1]s.ctl VALUES (false);
CREATE TABLE %[1]s.effects (message_id text NOT NULL, amount int NOT NULL); -- no unique key: duplicates would show
CREATE FUNCTION %[1]s.apply_event(doc jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT fail FROM %[1]s.ctl) THEN
    RAISE EXCEPTION 'ledger closed for %%', doc->>'message_id' USING ERRCODE = 'KP001';
  END IF;
  IF doc->'payload'->>'mode' = 'poison' THEN
    RAISE EXCEPTION 'bad order %%', doc->>'message_id' USING ERRCODE = 'KP001';
  END IF;
  INSERT INTO %[1]s.effects VALUES (doc->>'message_id', (doc->'payload'->>'amount')::int);
END $$;`, db.Schema))
	require.NoError(t, err)
}

func setFail(t *testing.T, db *testenv.DB, fail bool) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `UPDATE `+db.Schema+`.ctl SET fail = $1`, fail)
	require.NoError(t, err)
}

func effects(t *testing.T, db *testenv.DB) map[string]int {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT message_id, amount FROM `+db.Schema+`.effects`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		_, dup := out[id]
		require.False(t, dup, "effect of %s applied twice", id)
		out[id] = n
	}
	require.NoError(t, rows.Err())
	return out
}

func orderEvent(id string, amount int) envelope.Event {
	key := "k-" + id
	return envelope.Event{
		MessageID: id, Source: "ordering", Destination: "orders.v1", Key: &key, EventType: "OrderPlaced",
		SchemaVersion: 1, ContentType: envelope.ContentTypeJSON, OccurredAt: time.Now().UTC(),
		Payload: fmt.Appendf(nil, `{"amount":%d}`, amount),
	}
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	env := []string{"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(), "KEIRO_CONSUMER_SCHEMA=" + schema}
	for range 2 {
		r := runBinary(t, 30*time.Second, env, "migrate")
		require.Equal(t, 0, r.code, r.stderr)
		require.Regexp(t, `schema `+schema+` at version (\d+) of \d+`, r.stdout)
	}
	r := runBinary(t, 30*time.Second, env, "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.NotContains(t, r.stdout, "pending")

	empty := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	r = runBinary(t, 30*time.Second, []string{"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(), "KEIRO_CONSUMER_SCHEMA=" + empty}, "status")
	require.Equal(t, 1, r.code, r.stdout)
	require.Contains(t, r.stdout, "at version 0 of")
	require.Contains(t, r.stderr, "migrations pending")
}

func TestMigrateReportsUnreachableDatabase(t *testing.T) {
	t.Parallel()
	r := runBinary(t, 30*time.Second, []string{"KEIRO_CONSUMER_DATABASE_URL=postgres://app:pw-secret@127.0.0.1:1/x?connect_timeout=2"}, "migrate")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "connect to PostgreSQL")
	require.NotContains(t, r.stderr+r.stdout, "pw-secret")
}

func TestInboxFailedListAndRetry(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	sqlFixture(t, db)
	ctx := context.Background()
	h, err := handlers.NewSQL(handlers.SQLConfig{Function: db.Schema + ".apply_event"})
	require.NoError(t, err)
	store, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "billing"})
	require.NoError(t, err)

	// Three messages are poisoned while the ledger is closed; one is poison by content.
	setFail(t, db, true)
	for i, id := range []string{"m-1", "m-2", "m-3"} {
		res, err := store.Process(ctx, db.Pool, inbox.Delivery{Event: orderEvent(id, i+1)}, h.Handle)
		require.NoError(t, err)
		require.Equal(t, inbox.Poisoned, res.Outcome)
	}
	setFail(t, db, false)
	bad := orderEvent("m-bad", 0)
	bad.Payload = []byte(`{"mode":"poison"}`)
	res, err := store.Process(ctx, db.Pool, inbox.Delivery{Event: bad}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.Poisoned, res.Outcome)

	env := []string{
		"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(), "KEIRO_CONSUMER_SCHEMA=" + db.Schema,
		"KEIRO_CONSUMER_GROUP=billing", "KEIRO_CONSUMER_HANDLER=sql",
		"KEIRO_CONSUMER_SQL_FUNCTION=" + db.Schema + ".apply_event",
	}
	r := runBinary(t, 30*time.Second, env, "inbox", "failed", "list")
	require.Equal(t, 0, r.code, r.stderr)
	for _, k := range []string{"ordering:m-1", "ordering:m-2", "ordering:m-3", "ordering:m-bad"} {
		require.Contains(t, r.stdout, k)
	}
	require.Contains(t, r.stdout, "ledger closed for m-1")
	require.Equal(t, 5, strings.Count(r.stdout, "\n"), r.stdout) // header + 4 rows

	// Another consumer's name sees nothing.
	r = runBinary(t, 30*time.Second, env, "inbox", "failed", "list", "--name=shipping")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, 1, strings.Count(r.stdout, "\n"), r.stdout)

	// Retry by key: m-1 now succeeds.
	r = runBinary(t, 30*time.Second, env, "inbox", "failed", "retry", "ordering:m-1")
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "ordering:m-1\tprocessed")
	require.Equal(t, map[string]int{"m-1": 1}, effects(t, db))

	// A missing key and a row that fails again make the command fail, after doing the rest.
	r = runBinary(t, 30*time.Second, env, "inbox", "failed", "retry", "ordering:nope", "ordering:m-bad", "ordering:m-2")
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "ordering:nope\terror")
	require.Contains(t, r.stdout, "ordering:m-bad\tpoisoned")
	require.Contains(t, r.stdout, "ordering:m-2\tprocessed")
	require.Contains(t, r.stderr, "2 of 3 rows failed again")

	// Selection and confirmation never come from the environment.
	r = runBinary(t, 30*time.Second, append(env, "KEIRO_CONSUMER_ALL=true", "KEIRO_CONSUMER_YES=true"), "inbox", "failed", "retry")
	require.Equal(t, 2, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "give either row keys")
	// --all asks for --yes.
	r = runBinary(t, 30*time.Second, env, "inbox", "failed", "retry", "--all")
	require.Equal(t, 2, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "--yes: --all re-runs every failed row of the consumer; add --yes to confirm")
	// --dry-run shows what would be re-run and changes nothing.
	r = runBinary(t, 30*time.Second, env, "inbox", "failed", "retry", "--all", "--dry-run")
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "ordering:m-3\twould re-run\tattempts=1")
	require.Contains(t, r.stdout, "ordering:m-bad\twould re-run")
	require.Contains(t, r.stdout, "would re-run 2 of 2 rows (--dry-run: nothing changed)")
	r = runBinary(t, 30*time.Second, env, "inbox", "failed", "retry", "--dry-run", "ordering:m-1", "ordering:nope")
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "ordering:m-1\tskip\tcompleted")
	require.Contains(t, r.stdout, "ordering:nope\tskip\tno such row")
	require.Equal(t, map[string]int{"m-1": 1, "m-2": 2}, effects(t, db))

	// --all re-runs what is left; m-bad still fails, m-3 succeeds; effects happened once each.
	r = runBinary(t, 30*time.Second, env, "inbox", "failed", "retry", "--all", "--yes")
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "ordering:m-3\tprocessed")
	require.Contains(t, r.stdout, "1 of 2 rows re-run successfully")
	require.Equal(t, map[string]int{"m-1": 1, "m-2": 2, "m-3": 3}, effects(t, db))

	// Re-running a completed row is a no-op.
	r = runBinary(t, 30*time.Second, env, "inbox", "failed", "retry", "ordering:m-1")
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "ordering:m-1\tduplicate")

	r = runBinary(t, 30*time.Second, env, "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "consumer billing: 1 failed rows")

	r = runBinary(t, 30*time.Second, env, "inbox", "failed", "retry")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "give either row keys")
}
