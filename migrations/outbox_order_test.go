package migrations_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/migrations"
)

// TestOutboxOrderMigrationKeepsSeq: the migration that replaces the outbox's seq identity by a
// trigger-drawn sequence, applied to a schema that already holds rows, keeps every row's seq,
// continues after the identity's last value (not after the largest remaining seq), overrides a
// seq a writer supplies, refuses to change one, and is idempotent.
func TestOutboxOrderMigrationKeepsSeq(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	conn := connect(t)
	if err := migrations.MigrateBefore(ctx, conn, schema, "_outbox_order.sql"); err != nil {
		t.Fatalf("migrate to the release before: %v", err)
	}
	insert := func(id string, seq *int64) {
		t.Helper()
		cols, vals := "", ""
		if seq != nil {
			cols, vals = "seq, ", "$2, "
		}
		sql := `INSERT INTO ` + schema + `.keiro_outbox (` + cols + `outbox_id, message_id, source, destination,
            message_key, event_type, schema_version, content_type, payload_bytes, occurred_at)
            VALUES (` + vals + `gen_random_uuid(), $1, 's', 't', 'k', 'E', 1, 'application/json', '\x00', now())`
		args := []any{id}
		if seq != nil {
			args = append(args, *seq)
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("insert %s: %v", id, err)
		}
	}
	seqOf := func(id string) int64 {
		t.Helper()
		var seq int64
		if err := conn.QueryRow(ctx, `SELECT seq FROM `+schema+`.keiro_outbox WHERE message_id = $1`, id).Scan(&seq); err != nil {
			t.Fatalf("seq of %s: %v", id, err)
		}
		return seq
	}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		insert(id, nil)
	}
	// The last identity values belong to deleted rows: the sequence must not reuse them.
	if _, err := conn.Exec(ctx, `DELETE FROM `+schema+`.keiro_outbox WHERE message_id IN ('d', 'e')`); err != nil {
		t.Fatal(err)
	}
	before := map[string]int64{"a": seqOf("a"), "b": seqOf("b"), "c": seqOf("c")}

	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	for id, seq := range before {
		if got := seqOf(id); got != seq {
			t.Fatalf("row %s: seq %d became %d", id, seq, got)
		}
	}
	insert("f", nil)
	if got := seqOf("f"); got != 6 {
		t.Fatalf("first row after the migration: seq %d, want 6 (after the identity's last value 5)", got)
	}
	forged := int64(1)
	insert("g", &forged)
	if got := seqOf("g"); got != 7 {
		t.Fatalf("a supplied seq was kept: %d, want 7", got)
	}
	_, err := conn.Exec(ctx, `UPDATE `+schema+`.keiro_outbox SET seq = 100 WHERE message_id = 'g'`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
		t.Fatalf("changing seq: err %v, want feature_not_supported", err)
	}
	var identity string
	if err := conn.QueryRow(ctx, `SELECT attidentity::text FROM pg_attribute
        WHERE attrelid = ($1 || '.keiro_outbox')::regclass AND attname = 'seq'`, schema).Scan(&identity); err != nil {
		t.Fatal(err)
	}
	if identity != "" {
		t.Fatalf("seq is still an identity (%q)", identity)
	}

	// Idempotent: the same SQL applied again changes nothing.
	sql, err := migrations.Rendered(schema, "_outbox_order.sql")
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, sql); return err }); err != nil {
		t.Fatalf("apply the migration again: %v", err)
	}
	insert("h", nil)
	if got := seqOf("h"); got != 8 {
		t.Fatalf("after re-applying: seq %d, want 8", got)
	}
}

// TestOutboxOrderMigrationOnAFreshSchema: on an empty outbox the first row gets seq 1, and a
// writer that bypasses the ordering trigger (triggers off for replication) fails instead of
// writing a row with no place in the order.
func TestOutboxOrderMigrationOnAFreshSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	conn := connect(t)
	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		t.Fatal(err)
	}
	var seq int64
	if err := conn.QueryRow(ctx, `INSERT INTO `+schema+`.keiro_outbox (outbox_id, message_id, source, destination,
        event_type, schema_version, content_type, payload_bytes, occurred_at)
        VALUES (gen_random_uuid(), 'a', 's', 't', 'E', 1, 'application/json', '\x00', now()) RETURNING seq`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	if seq != 1 {
		t.Fatalf("first seq %d, want 1", seq)
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.keiro_outbox (outbox_id, message_id, source, destination,
            event_type, schema_version, content_type, payload_bytes, occurred_at)
            VALUES (gen_random_uuid(), 'b', 's', 't', 'E', 1, 'application/json', '\x00', now())`)
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23502" || pgErr.ColumnName != "seq" {
		t.Fatalf("insert without the trigger: err %v, want a not-null violation on seq", err)
	}
}
