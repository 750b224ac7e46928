// Package testdb gives each test its own migrated PostgreSQL schema on the server named by
// KEIRO_TEST_DATABASE_URL, so tests run in parallel without seeing each other's rows.
//
// A test that needs PostgreSQL fails, never skips, when the server is unreachable: a green run
// must mean the storage was exercised.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/migrations"
)

// DefaultURL is used when KEIRO_TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// URL returns the test database URL.
func URL() string {
	if u := os.Getenv("KEIRO_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's isolated schema and a pool whose connections use it as search_path.
type DB struct {
	// Pool is connected to the test database with search_path set to Schema.
	Pool *pgxpool.Pool
	// Schema is the migrated schema, unique to the test.
	Schema string
	// ConnString is a connection string for the same database whose search_path is Schema,
	// for processes started by the test.
	ConnString string
}

var reachable struct {
	once sync.Once
	err  error
}

func checkReachable(ctx context.Context) error {
	reachable.once.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, URL())
		if err != nil {
			reachable.err = err
			return
		}
		defer conn.Close(ctx)
		reachable.err = conn.Ping(ctx)
	})
	return reachable.err
}

// NewSchema creates an empty, unmigrated schema unique to t and drops it when t ends.
func NewSchema(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	if err := checkReachable(ctx); err != nil {
		t.Fatalf("PostgreSQL is unreachable at %s (set KEIRO_TEST_DATABASE_URL, or start it with "+
			"`pg_ctlcluster <version> main start`): %v", URL(), err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create test schema: %v", err)
	}
	t.Cleanup(func() {
		if os.Getenv("KEIRO_TEST_KEEP_SCHEMA") != "" {
			t.Logf("keeping schema %s", schema)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, URL())
		if err != nil {
			t.Errorf("connect to drop test schema: %v", err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	return schema
}

// New creates a schema unique to t, applies every migration to it, and returns a pool whose
// connections have it as search_path. Everything is dropped when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	ctx := context.Background()
	schema := NewSchema(t)
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	defer conn.Close(ctx)
	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		t.Fatalf("migrate test schema: %v", err)
	}
	cs, err := WithSearchPath(URL(), schema)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(cs)
	if err != nil {
		t.Fatalf("parse test database URL: %v", err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("open test pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return &DB{Pool: pool, Schema: schema, ConnString: cs}
}

// WithSearchPath returns connString (a URL or a key=value DSN) with search_path set to schema.
func WithSearchPath(connString, schema string) (string, error) {
	if _, err := pgx.ParseConfig(connString); err != nil {
		return "", fmt.Errorf("parse database URL: %w", err)
	}
	if !strings.Contains(connString, "://") {
		return connString + " search_path=" + schema, nil
	}
	u, err := url.Parse(connString)
	if err != nil {
		return "", fmt.Errorf("parse database URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}
