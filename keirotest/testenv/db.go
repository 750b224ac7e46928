package testenv

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

// DefaultDatabaseURL is the database used when neither KEIRO_TEST_DATABASE_URL nor
// DATABASE_URL is set: a local PostgreSQL with trust authentication.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DefaultMaxConns is the pool size of a DB.
const DefaultMaxConns = 16

// DatabaseURL returns the test database's connection string: KEIRO_TEST_DATABASE_URL, else
// DATABASE_URL, else DefaultDatabaseURL.
func DatabaseURL() string {
	for _, name := range []string{"KEIRO_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(name); u != "" {
			return u
		}
	}
	return DefaultDatabaseURL
}

// DB is one test's migrated PostgreSQL schema and a pool whose connections use it as their
// search_path, so unqualified table names resolve to it.
type DB struct {
	// Pool is connected to the test database with search_path set to Schema. It is closed
	// when the test ends.
	Pool *pgxpool.Pool
	// Schema is the schema, unique to the test: pass it to outbox.NewStore,
	// inbox.StoreConfig.Schema and the other components' Schema fields.
	Schema string
	// ConnString connects to the same database with search_path set to Schema, for processes
	// the test starts (a relay or consumer binary).
	ConnString string
}

// DBConfig configures NewDBWith.
type DBConfig struct {
	// URL is the PostgreSQL connection string (a URL or a key=value DSN). Defaults to
	// DatabaseURL().
	URL string
	// SkipMigrations leaves the schema empty, for tests of migrating it. Defaults to false
	// (every keiro migration is applied).
	SkipMigrations bool
	// MaxConns is the pool's size. Defaults to DefaultMaxConns.
	MaxConns int32
}

// NewDB creates a schema unique to t on the database named by DatabaseURL, applies keiro's
// migrations to it, and opens a pool whose search_path is that schema. The schema is dropped
// and the pool closed when t ends. Safe with t.Parallel.
func NewDB(t testing.TB) *DB {
	t.Helper()
	return NewDBWith(t, DBConfig{})
}

// NewDBWith is NewDB with a configuration.
func NewDBWith(t testing.TB, cfg DBConfig) *DB {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = DatabaseURL()
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConns < 0 {
		t.Fatalf("keirotest.NewDBWith: DBConfig.MaxConns must be positive, got %d", cfg.MaxConns)
	}
	connCfg, err := pgx.ParseConfig(cfg.URL)
	if err != nil {
		t.Fatalf("keirotest: parse the test database URL: %v", err)
	}
	requireReachable(t, cfg.URL, connCfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, connCfg)
	if err != nil {
		t.Fatalf("keirotest: connect to the test database: %v", err)
	}
	defer conn.Close(ctx)
	schema := createSchema(ctx, t, conn, connCfg)
	if !cfg.SkipMigrations {
		if err := migrations.Migrate(ctx, conn, schema); err != nil {
			t.Fatalf("keirotest: migrate test schema %s: %v", schema, err)
		}
	}
	cs, err := withSearchPath(cfg.URL, schema)
	if err != nil {
		t.Fatalf("keirotest: %v", err)
	}
	poolCfg, err := pgxpool.ParseConfig(cs)
	if err != nil {
		t.Fatalf("keirotest: parse the test database URL: %v", err)
	}
	poolCfg.MaxConns = cfg.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		t.Fatalf("keirotest: open the test pool: %v", err)
	}
	t.Cleanup(pool.Close) // runs before the schema's drop (cleanups run last-in first-out)
	return &DB{Pool: pool, Schema: schema, ConnString: cs}
}

// NewSchema creates a schema unique to t on pool's database, applies keiro's migrations to
// it and returns its name; it is dropped when t ends. pool's search_path is left alone: pass
// the name to the components' Schema fields (and to the kit's options). Safe with
// t.Parallel.
func NewSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	if pool == nil {
		t.Fatal("keirotest.NewSchema: pool is nil; open one with pgxpool.New, or use keirotest.NewDB")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("keirotest.NewSchema: connect to the database: %v", err)
	}
	defer c.Release()
	schema := createSchema(ctx, t, c.Conn(), pool.Config().ConnConfig)
	if err := migrations.Migrate(ctx, c.Conn(), schema); err != nil {
		t.Fatalf("keirotest.NewSchema: migrate test schema %s: %v", schema, err)
	}
	return schema
}

// createSchema creates a uniquely named schema on conn and registers its drop, through a
// connection of its own built from connCfg (the test's pool may be closed by then).
func createSchema(ctx context.Context, t testing.TB, conn *pgx.Conn, connCfg *pgx.ConnConfig) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("keirotest: create test schema: %v", err)
	}
	dropCfg := connCfg.Copy()
	t.Cleanup(func() {
		if os.Getenv("KEIRO_TEST_KEEP_SCHEMA") != "" {
			t.Logf("keirotest: keeping schema %s (KEIRO_TEST_KEEP_SCHEMA is set)", schema)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.ConnectConfig(ctx, dropCfg)
		if err != nil {
			t.Errorf("keirotest: connect to drop test schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("keirotest: drop test schema %s: %v", schema, err)
		}
	})
	return schema
}

// reachable remembers, per database URL, whether the server answered once.
var reachable sync.Map // string -> *reachability

type reachability struct {
	once sync.Once
	err  error
}

// requireReachable fails t with directions when the server behind url does not answer. It
// asks once per URL and process.
func requireReachable(t testing.TB, url string, connCfg *pgx.ConnConfig) {
	t.Helper()
	v, _ := reachable.LoadOrStore(url, &reachability{})
	r := v.(*reachability)
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.ConnectConfig(ctx, connCfg.Copy())
		if err != nil {
			r.err = err
			return
		}
		defer conn.Close(ctx)
		r.err = conn.Ping(ctx)
	})
	if r.err != nil {
		t.Fatalf("keirotest: PostgreSQL is unreachable at %s:%d (set KEIRO_TEST_DATABASE_URL or DATABASE_URL "+
			"to a server the tests may create schemas on, or start the local one): %v", connCfg.Host, connCfg.Port, r.err)
	}
}

// withSearchPath returns connString (a URL or a key=value DSN) with search_path set to schema.
func withSearchPath(connString, schema string) (string, error) {
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
