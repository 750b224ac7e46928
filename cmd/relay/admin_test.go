package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

func testEvent(id, source, topic string, key *string) envelope.Event {
	return envelope.Event{
		MessageID:   id,
		Source:      source,
		Destination: topic,
		Key:         key,
		EventType:   "OrderPlaced",
		ContentType: envelope.ContentTypeJSON,
		Payload:     []byte(`{"id":"` + id + `"}`),
		OccurredAt:  time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC),
	}
}

// seed enqueues events through the outbox API and returns their outbox ids by message id.
func seed(t *testing.T, db *testenv.DB, events ...envelope.Event) map[string]string {
	t.Helper()
	ctx := context.Background()
	st, err := outbox.NewStore(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(ctx, tx, events...)
		return err
	})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	ids := map[string]string{}
	rows, err := db.Pool.Query(ctx, fmt.Sprintf("SELECT message_id, outbox_id::text FROM %s.keiro_outbox", db.Schema))
	if err != nil {
		t.Fatal(err)
	}
	var m, id string
	if _, err := pgx.ForEachRow(rows, []any{&m, &id}, func() error { ids[m] = id; return nil }); err != nil {
		t.Fatal(err)
	}
	return ids
}

// setStatus forces rows into a state, as the relay would have left them.
func setStatus(t *testing.T, db *testenv.DB, status, lastError string, messageIDs ...string) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s.keiro_outbox
		SET status = $1, last_error = NULLIF($2, ''), attempt_count = 3,
		    rejection_code = CASE WHEN $1 = 'rejected' THEN 'message_too_large' END,
		    rejected_at = CASE WHEN $1 = 'rejected' THEN now() END,
		    published_at = CASE WHEN $1 = 'sent' THEN now() END
		WHERE message_id = ANY($3)`, db.Schema), status, lastError, messageIDs)
	if err != nil {
		t.Fatal(err)
	}
}

func statusOf(t *testing.T, db *testenv.DB, messageID string) (status string, attempts int) {
	t.Helper()
	err := db.Pool.QueryRow(context.Background(), fmt.Sprintf(
		"SELECT status, attempt_count FROM %s.keiro_outbox WHERE message_id = $1", db.Schema), messageID).Scan(&status, &attempts)
	if err != nil {
		t.Fatal(err)
	}
	return status, attempts
}

func k(s string) *string { return &s }

func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	for i := range 2 { // idempotent
		r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+schema, "migrate")
		if r.code != 0 {
			t.Fatalf("migrate #%d: exit %d: %s", i, r.code, r.stderr)
		}
		want := fmt.Sprintf("schema %s at version %d of %d", schema, migrations.Latest(), migrations.Latest())
		if !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "001_outbox.sql") {
			t.Fatalf("migrate output:\n%s", r.stdout)
		}
	}
	// The tables exist now: status works.
	if r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+schema, "status"); r.code != 0 {
		t.Fatalf("status after migrate: %d %s", r.code, r.stderr)
	}
}

func TestStatusOnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+schema, "status")
	if r.code != 1 || !strings.Contains(r.stderr, "relay migrate") {
		t.Fatalf("want a failure telling to migrate, got %d %s", r.code, r.stderr)
	}
}

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	seed(t, db,
		testEvent("a1", "ordering", "orders", k("o1")),
		testEvent("a2", "ordering", "orders", k("o2")),
		testEvent("a3", "ordering", "orders", k("o3")),
		testEvent("b1", "billing", "invoices", nil),
		testEvent("b2", "billing", "invoices", nil),
	)
	setStatus(t, db, "sent", "", "a1")
	setStatus(t, db, "dead", "broker down", "a2")
	setStatus(t, db, "rejected", "too large", "b2")
	// The oldest pending row is a3 (or b1): make it a minute old.
	if _, err := db.Pool.Exec(context.Background(), fmt.Sprintf(
		"UPDATE %s.keiro_outbox SET created_at = now() - interval '90 seconds' WHERE message_id = 'a3'", db.Schema)); err != nil {
		t.Fatal(err)
	}

	r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "status", "--json")
	if r.code != 0 {
		t.Fatalf("status --json: %d %s", r.code, r.stderr)
	}
	var st outboxStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if st.Destinations["orders"]["pending"] != 1 || st.Destinations["orders"]["sent"] != 1 ||
		st.Destinations["orders"]["dead"] != 1 || st.Destinations["invoices"]["pending"] != 1 ||
		st.Destinations["invoices"]["rejected"] != 1 {
		t.Fatalf("counts: %+v", st.Destinations)
	}
	if st.Totals["pending"] != 2 || st.Backlog != 2 || st.Dead != 2 {
		t.Fatalf("totals %+v backlog %d dead %d", st.Totals, st.Backlog, st.Dead)
	}
	if st.OldestPendingAgeSeconds == nil || *st.OldestPendingAgeSeconds < 89 || *st.OldestPendingAgeSeconds > 600 {
		t.Fatalf("oldest pending age: %v", st.OldestPendingAgeSeconds)
	}

	r = invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "status")
	if r.code != 0 {
		t.Fatalf("status: %d %s", r.code, r.stderr)
	}
	for _, want := range []string{"DESTINATION", "PENDING", "REJECTED", "orders", "invoices", "TOTAL",
		"backlog (pending+failed+publishing): 2", "oldest pending or failed: 1m3", "dead or rejected: 2 (see `relay dead list`)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status table lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestStatusEmptyOutbox(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "status", "--json")
	var st outboxStatus
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
		t.Fatalf("%d %s %s", r.code, r.stdout, r.stderr)
	}
	if st.OldestPendingAgeSeconds != nil || st.Backlog != 0 || st.Dead != 0 {
		t.Fatalf("empty outbox: %+v", st)
	}
}

func TestDeadListAndRequeue(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ids := seed(t, db,
		testEvent("d1", "ordering", "orders", k("o1")),
		testEvent("d2", "ordering", "orders", k("o2")),
		testEvent("d3", "billing", "invoices", nil),
		testEvent("d4", "billing", "payments", nil),
		testEvent("p1", "ordering", "orders", k("o9")),
		testEvent("s1", "ordering", "orders", k("o8")),
	)
	setStatus(t, db, "dead", "kafka: NOT_ENOUGH_REPLICAS after 10 attempts", "d1", "d2", "d3")
	setStatus(t, db, "rejected", "record too large", "d4")
	setStatus(t, db, "sent", "", "s1")
	base := []string{"--database-url=" + testenv.DatabaseURL(), "--schema=" + db.Schema}
	run := func(args ...string) result { return invoke(t, append(base, args...)...) }

	r := run("dead", "list")
	if r.code != 0 {
		t.Fatalf("dead list: %d %s", r.code, r.stderr)
	}
	for _, id := range []string{ids["d1"], ids["d2"], ids["d3"], ids["d4"]} {
		if !strings.Contains(r.stdout, id) {
			t.Errorf("dead list lacks %s:\n%s", id, r.stdout)
		}
	}
	if strings.Contains(r.stdout, ids["p1"]) || strings.Contains(r.stdout, ids["s1"]) {
		t.Errorf("dead list shows live rows:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "NOT_ENOUGH_REPLICAS") || !strings.Contains(r.stdout, "message_too_large: record too large") {
		t.Errorf("dead list lacks the reasons:\n%s", r.stdout)
	}

	r = run("dead", "list", "--source=ordering", "--json")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 {
		t.Fatalf("dead list --source: %d\n%s", r.code, r.stdout)
	}
	var row deadRow
	if err := json.Unmarshal([]byte(lines[0]), &row); err != nil || row.OutboxID != ids["d1"] || row.Key == nil ||
		*row.Key != "o1" || row.Attempts != 3 || row.MessageID != "d1" || row.Status != "dead" {
		t.Fatalf("first dead row: %+v %v", row, err)
	}
	r = run("dead", "list", "--destination=payments", "--json")
	if strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, ids["d4"]) {
		t.Fatalf("dead list --destination:\n%s", r.stdout)
	}
	r = run("dead", "list", "--limit=1")
	if !strings.Contains(r.stdout, ids["d1"]) || strings.Contains(r.stdout, ids["d2"]) || !strings.Contains(r.stderr, "raise --limit") {
		t.Fatalf("dead list --limit=1:\n%s\n%s", r.stdout, r.stderr)
	}

	// Requeue by id: the row is pending again with a fresh attempt budget; the warning is printed.
	r = run("dead", "requeue", ids["d1"])
	if r.code != 0 || strings.TrimSpace(r.stdout) != ids["d1"] || !strings.Contains(r.stderr, "AFTER later events of") {
		t.Fatalf("requeue by id: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if s, a := statusOf(t, db, "d1"); s != "pending" || a != 0 {
		t.Fatalf("d1 after requeue: %s attempts %d", s, a)
	}
	// Live and unknown ids are not touched, and the command says so with a failure.
	r = run("dead", "requeue", ids["p1"], ids["s1"], "00000000-0000-7000-8000-000000000000")
	if r.code != 1 || !strings.Contains(r.stderr, "not requeued") || !strings.Contains(r.stderr, ids["s1"]+" (sent)") ||
		!strings.Contains(r.stderr, ids["p1"]+" (pending)") || !strings.Contains(r.stderr, "-000000000000 (no such row)") {
		t.Fatalf("requeue of live rows: %d\n%s", r.code, r.stderr)
	}
	if s, _ := statusOf(t, db, "s1"); s != "sent" {
		t.Fatalf("a sent row was requeued: %s", s)
	}

	// Source and destination combine: billing has no dead row for "orders-none".
	r = run("dead", "requeue", "--source=billing", "--destination=orders-none")
	if r.code != 0 || !strings.Contains(r.stderr, "requeued 0 row(s)") {
		t.Fatalf("requeue --source --destination: %d\n%s", r.code, r.stderr)
	}
	if r = run("dead", "requeue", ids["d2"], "--destination=payments"); r.code != 2 || !strings.Contains(r.stderr, "choose one of") {
		t.Fatalf("requeue by id and destination: %d\n%s", r.code, r.stderr)
	}
	// By source: only that source's dead rows.
	r = run("dead", "requeue", "--source=billing")
	if r.code != 0 || !strings.Contains(r.stderr, "requeued 2 row(s)") {
		t.Fatalf("requeue --source: %d\n%s", r.code, r.stdout)
	}
	if got := strings.Fields(r.stdout); len(got) != 2 || !slices.Contains(got, ids["d4"]) {
		t.Fatalf("requeue --source prints the requeued ids, one per line: %q", r.stdout)
	}
	if s, _ := statusOf(t, db, "d4"); s != "pending" {
		t.Fatalf("rejected row of billing not requeued: %s", s)
	}
	if s, _ := statusOf(t, db, "d2"); s != "dead" {
		t.Fatalf("ordering row requeued by --source=billing: %s", s)
	}

	// --all needs --yes; with it, every remaining dead row.
	if r = run("dead", "requeue", "--all"); r.code != 2 {
		t.Fatalf("--all without --yes: %d", r.code)
	}
	if s, _ := statusOf(t, db, "d2"); s != "dead" {
		t.Fatal("--all without --yes changed rows")
	}
	// --dry-run prints the rows and changes nothing.
	r = run("dead", "requeue", "--all", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stderr, "would requeue 1 row(s) (--dry-run: nothing changed)") || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("requeue --all --dry-run: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if s, _ := statusOf(t, db, "d2"); s != "dead" {
		t.Fatal("--dry-run changed rows")
	}
	r = run("dead", "requeue", "--all", "--yes")
	if r.code != 0 || !strings.Contains(r.stderr, "requeued 1 row(s)") {
		t.Fatalf("requeue --all: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = run("status", "--json")
	var st outboxStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Dead != 0 || st.Totals["pending"] != 5 {
		t.Fatalf("status after requeues: %+v %v", st, err)
	}
}

// Selection and confirmation never come from the environment: KEIRO_RELAY_ALL, _YES, _SOURCE
// and _DESTINATION are ignored by dead requeue. (Not parallel: it sets the process environment.)
func TestRequeueIgnoresSelectionFromTheEnvironment(t *testing.T) {
	db := testenv.NewDB(t)
	seed(t, db, testEvent("d1", "ordering", "orders", k("o1")))
	setStatus(t, db, "dead", "boom", "d1")
	t.Setenv("KEIRO_RELAY_ALL", "1")
	t.Setenv("KEIRO_RELAY_YES", "true")
	t.Setenv("KEIRO_RELAY_SOURCE", "ordering")
	t.Setenv("KEIRO_RELAY_DESTINATION", "orders")
	t.Setenv("KEIRO_RELAY_DRY_RUN", "true")
	r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "dead", "requeue")
	if r.code != 2 || !strings.Contains(r.stderr, "say which rows") {
		t.Fatalf("requeue with KEIRO_RELAY_ALL/YES/SOURCE set: %d\n%s", r.code, r.stderr)
	}
	r = invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "dead", "requeue", "--all")
	if r.code != 2 || !strings.Contains(r.stderr, "add --yes to confirm") {
		t.Fatalf("requeue --all with KEIRO_RELAY_YES set: %d\n%s", r.code, r.stderr)
	}
	if s, _ := statusOf(t, db, "d1"); s != "dead" {
		t.Fatalf("the environment requeued a row: %s", s)
	}
}

// A requeue wakes listening relays through the outbox's NOTIFY channel.
func TestRequeueNotifies(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	seed(t, db, testEvent("n1", "ordering", "orders", k("o1")))
	setStatus(t, db, "dead", "x", "n1")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf(`LISTEN "%s.keiro_outbox"`, db.Schema)); err != nil {
		t.Fatal(err)
	}
	if r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "dead", "requeue", "--all", "--yes"); r.code != 0 {
		t.Fatalf("requeue: %d %s", r.code, r.stderr)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err != nil || n.Channel != db.Schema+".keiro_outbox" {
		t.Fatalf("no notification: %v %+v", err, n)
	}
}

// relay mode set log creates the slot and switches the schema; relay status and relay mode
// show the slot; relay mode set claim switches back.
func TestModeCommands(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	slot := db.Schema + "_keiro_log"
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		_, _ = db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+slot)
	})
	base := []string{"--database-url=" + testenv.DatabaseURL(), "--schema=" + db.Schema}
	r := invoke(t, append(base, "mode")...)
	if r.code != 0 || !strings.Contains(r.stdout, "mode claim") {
		t.Fatalf("mode: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = invoke(t, append(base, "mode", "set", "log")...)
	if r.code != 0 || !strings.Contains(r.stdout, "mode log (was claim)") {
		t.Fatalf("mode set log: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = invoke(t, append(base, "status", "--json")...)
	var st outboxStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if st.Mode != "log" || st.LogSlot == nil || st.LogSlot.Slot != slot || st.LogSlot.ActivePID != 0 || st.LogSlot.WALStatus == "" {
		t.Fatalf("status: mode %q, slot %+v", st.Mode, st.LogSlot)
	}
	r = invoke(t, append(base, "status")...)
	if !strings.Contains(r.stdout, "mode: log") || !strings.Contains(r.stdout, "log slot "+slot+": reader none") {
		t.Fatalf("status:\n%s", r.stdout)
	}
	r = invoke(t, append(base, "mode", "set", "claim")...)
	if r.code != 0 || !strings.Contains(r.stdout, "mode claim (was log)") || !strings.Contains(r.stdout, "confirmed position at or past") {
		t.Fatalf("mode set claim: %d %s %s", r.code, r.stdout, r.stderr)
	}
}

// Archived rows are counted apart: in neither the table nor "dead or rejected".
func TestStatusCountsArchivedRowsApart(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	seed(t, db,
		testEvent("a1", "ordering", "orders", k("o1")),
		testEvent("a2", "ordering", "orders", k("o2")),
		testEvent("a3", "ordering", "orders", k("o3")),
	)
	setStatus(t, db, "dead", "broker down", "a1", "a2")
	if _, err := db.Pool.Exec(context.Background(), fmt.Sprintf(
		"UPDATE %s.keiro_outbox SET archived_at = now() WHERE message_id = 'a1'", db.Schema)); err != nil {
		t.Fatal(err)
	}
	r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "status", "--json")
	var st outboxStatus
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
		t.Fatalf("%d %s %s", r.code, r.stdout, r.stderr)
	}
	if st.Dead != 1 || st.Archived != 1 || st.Totals["dead"] != 1 || st.Destinations["orders"]["dead"] != 1 || st.Backlog != 1 {
		t.Fatalf("archived a1 counted as dead: %+v", st)
	}
	r = invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "status")
	for _, want := range []string{"dead or rejected: 1 (see `relay dead list`)", "archived (dead or rejected, set aside): 1"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("status lacks %q: %d\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
}

// `relay status` works on a schema migrated up to 010, before the archive.
func TestStatusBeforeTheArchiveMigration(t *testing.T) {
	t.Parallel()
	db := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true})
	ctx := context.Background()
	c, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	m, err := migrate.NewMigratorEx(ctx, c.Conn(), db.Schema+".keiro_schema_version", &migrate.MigratorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.Data["schema"] = db.Schema
	if err := m.LoadMigrations(os.DirFS("../../migrations/sql")); err != nil {
		t.Fatal(err)
	}
	if err := m.MigrateTo(ctx, 10); err != nil {
		t.Fatal(err)
	}
	c.Release()
	seed(t, db, testEvent("a1", "ordering", "orders", k("o1")), testEvent("a2", "ordering", "orders", k("o2")))
	setStatus(t, db, "dead", "broker down", "a1")

	r := invoke(t, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "status", "--json")
	var st outboxStatus
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
		t.Fatalf("%d %s %s", r.code, r.stdout, r.stderr)
	}
	if st.SchemaVersion != 10 || st.Dead != 1 || st.Archived != 0 || st.Backlog != 1 || st.Mode == "" {
		t.Fatalf("status of a schema at 010: %+v", st)
	}
}

// relay mode recover copies a time range of keiro_outbox_log into keiro_outbox, and refuses a
// bad range before it connects.
func TestModeRecover(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.keiro_outbox_log (outbox_id, message_id, source,
		destination, message_key, event_type, schema_version, content_type, payload_bytes, occurred_at, created_at)
		VALUES (gen_random_uuid(), 'r1', 'ordering', 'orders', 'k', 'OrderPlaced', 1, 'application/json', '\x7b7d', now(), now() - interval '30 minutes'),
		       (gen_random_uuid(), 'r2', 'ordering', 'orders', 'k', 'OrderPlaced', 1, 'application/json', '\x7b7d', now(), now() - interval '3 hours')`,
		db.Schema)); err != nil {
		t.Fatal(err)
	}
	base := []string{"--database-url=" + testenv.DatabaseURL(), "--schema=" + db.Schema, "mode", "recover"}
	r := invoke(t, append(base, "--since=1h")...)
	if r.code != 0 || !strings.Contains(r.stdout, ": 1 events, 1 copied into keiro_outbox to be published again, 0 already there") {
		t.Fatalf("recover: %d %s %s", r.code, r.stdout, r.stderr)
	}
	var status string
	if err := db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT status FROM %s.keiro_outbox WHERE message_id = 'r1'`, db.Schema)).Scan(&status); err != nil || status != "failed" {
		t.Fatalf("r1 in keiro_outbox: %q %v", status, err)
	}
	r = invoke(t, append(base, "--since=1h")...)
	if r.code != 0 || !strings.Contains(r.stdout, ": 1 events, 0 copied") {
		t.Fatalf("second recover: %d %s %s", r.code, r.stdout, r.stderr)
	}
	for _, bad := range [][]string{{"--since=yesterday"}, {"--since=1h", "--until=2h"}, {"--since=-1h"}} {
		r = invoke(t, append(base, bad...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "--") {
			t.Errorf("%v: exit %d, stderr %s", bad, r.code, r.stderr)
		}
	}
	r = invoke(t, base...)
	if r.code != 2 || !strings.Contains(r.stderr, "--since") {
		t.Errorf("no --since: exit %d, stderr %s", r.code, r.stderr)
	}
}

// Per-destination relays in log mode: `mode prepare` creates a group's slot before the switch,
// `mode set log --destinations` another's and switches, `status` and `mode show` list every
// slot with its destinations, the slot of every destination is refused beside them, and
// `mode recover --destinations` copies only those destinations' events.
func TestModeDestinationGroups(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	orders, payments := outbox.LogSlotFor(db.Schema, []string{"orders"}), outbox.LogSlotFor(db.Schema, []string{"payments"})
	t.Cleanup(func() {
		for _, slot := range []string{orders, payments, outbox.DefaultLogSlot(db.Schema)} {
			_, _ = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
			_, _ = db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+slot)
		}
	})
	base := []string{"--database-url=" + testenv.DatabaseURL(), "--schema=" + db.Schema}
	r := invoke(t, append(base, "mode", "prepare", "--destinations=orders")...)
	if r.code != 0 || !strings.Contains(r.stdout, "log slot "+orders+" created for orders") {
		t.Fatalf("mode prepare: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = invoke(t, append(base, "mode", "set", "log", "--destinations=payments")...)
	if r.code != 0 || !strings.Contains(r.stdout, "mode log (was claim)") {
		t.Fatalf("mode set log --destinations: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = invoke(t, append(base, "mode", "set", "log")...)
	if r.code == 0 || !strings.Contains(r.stderr, "would publish every destination") {
		t.Fatalf("mode set log beside the groups: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = invoke(t, append(base, "status", "--json")...)
	var st outboxStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	got := map[string]string{}
	for _, s := range st.LogSlots {
		got[s.Slot] = strings.Join(s.Destinations, ",")
	}
	if st.LogSlot != nil || len(got) != 2 || got[orders] != "orders" || got[payments] != "payments" {
		t.Fatalf("status: default slot %+v, slots %v", st.LogSlot, got)
	}
	r = invoke(t, append(base, "mode")...)
	if !strings.Contains(r.stdout, "log slot "+orders+" (destinations orders): reader none") ||
		!strings.Contains(r.stdout, "log slot "+payments+" (destinations payments): reader none") {
		t.Fatalf("mode show:\n%s", r.stdout)
	}
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.keiro_outbox_log (outbox_id, message_id, source,
		destination, message_key, event_type, schema_version, content_type, payload_bytes, occurred_at, created_at)
		VALUES (gen_random_uuid(), 'o1', 'ordering', 'orders', 'k', 'OrderPlaced', 1, 'application/json', '\x7b7d', now(), now() - interval '30 minutes'),
		       (gen_random_uuid(), 'p1', 'ordering', 'payments', 'k', 'PaymentTaken', 1, 'application/json', '\x7b7d', now(), now() - interval '30 minutes')`,
		db.Schema)); err != nil {
		t.Fatal(err)
	}
	r = invoke(t, append(base, "mode", "recover", "--since=1h", "--destinations=payments")...)
	if r.code != 0 || !strings.Contains(r.stdout, ": 1 events, 1 copied") {
		t.Fatalf("recover --destinations: %d %s %s", r.code, r.stdout, r.stderr)
	}
}
