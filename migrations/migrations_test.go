package migrations_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/migrations"
)

func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), testenv.DatabaseURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestMigrateTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	conn := connect(t)

	st, err := migrations.GetStatus(ctx, conn, schema)
	if err != nil {
		t.Fatal(err)
	}
	if st.Current != 0 || !st.Pending() || st.Latest != migrations.Latest() || len(st.Migrations) == 0 {
		t.Fatalf("fresh schema status = %+v", st)
	}
	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		t.Fatal(err)
	}
	var tables int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	var tables2 int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables2); err != nil {
		t.Fatal(err)
	}
	if tables != tables2 {
		t.Fatalf("second migrate changed table count %d -> %d", tables, tables2)
	}
	st, err = migrations.GetStatus(ctx, conn, schema)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending() || st.Current != st.Latest {
		t.Fatalf("after migrate status = %+v", st)
	}
	for _, m := range st.Migrations {
		if !m.Applied {
			t.Fatalf("migration %d %s not applied", m.Version, m.Name)
		}
	}
	for _, table := range []string{"keiro_outbox", "keiro_inbox"} {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname=$1 AND tablename=$2)`, schema, table).Scan(&ok); err != nil || !ok {
			t.Fatalf("table %s.%s missing (err %v)", schema, table, err)
		}
	}
}

func TestConcurrentMigratorsDoNotConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	// Drop the pre-created schema so the migrators also race on CREATE SCHEMA.
	if _, err := connect(t).Exec(ctx, "DROP SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		conn := connect(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = migrations.Migrate(ctx, conn, schema)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent migrate: %v", err)
	}
	st, err := migrations.GetStatus(ctx, connect(t), schema)
	if err != nil {
		t.Fatal(err)
	}
	if st.Current != st.Latest {
		t.Fatalf("status after concurrent migrate = %+v", st)
	}
}

func TestInvalidSchemaNames(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "Keiro", "1abc", "a-b", "a;drop", "pg_catalog", `"x"`,
		"a234567890123456789012345678901234567890123456789012345678901234"} {
		if err := migrations.ValidateSchema(bad); !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("ValidateSchema(%q) = %v, want ErrInvalidSchema", bad, err)
		}
		if err := migrations.Migrate(context.Background(), nil, bad); !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("Migrate(%q) = %v, want ErrInvalidSchema", bad, err)
		}
	}
	for _, good := range []string{"keiro", "_x", "billing_inbox", "k9"} {
		if err := migrations.ValidateSchema(good); err != nil {
			t.Errorf("ValidateSchema(%q) = %v", good, err)
		}
	}
}
