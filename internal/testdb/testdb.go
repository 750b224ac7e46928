// Package testdb gives each test its own migrated PostgreSQL schema on the server named by
// KEIRO_TEST_DATABASE_URL, so tests run in parallel without seeing each other's rows. It is a
// thin layer over the public test kit (keirotest/testenv, re-exported by keirotest), which users' tests use the same way.
//
// A test that needs PostgreSQL fails, never skips, when the server is unreachable: a green run
// must mean the storage was exercised.
package testdb

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// DefaultURL is used when KEIRO_TEST_DATABASE_URL is unset.
const DefaultURL = testenv.DefaultDatabaseURL

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

// NewSchema creates an empty, unmigrated schema unique to t and drops it when t ends.
func NewSchema(t testing.TB) string {
	t.Helper()
	return testenv.NewDBWith(t, testenv.DBConfig{URL: URL(), SkipMigrations: true, MaxConns: 1}).Schema
}

// New creates a schema unique to t, applies every migration to it, and returns a pool whose
// connections have it as search_path. Everything is dropped when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	db := testenv.NewDBWith(t, testenv.DBConfig{URL: URL()})
	return &DB{Pool: db.Pool, Schema: db.Schema, ConnString: db.ConnString}
}
