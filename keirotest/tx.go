package keirotest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/migrations"
)

// TxSchema is the schema NewTx's transactions use: migrated once per test process and
// database, shared by the tests of every process, and always empty, since nothing written in it
// is ever committed.
const TxSchema = "keirotest_tx"

// ErrTxCommit is what Tx.Commit returns: a NewTx transaction is rolled back when the test ends,
// and the code under test must not commit it.
var ErrTxCommit = errors.New("keirotest: the test's transaction (keirotest.NewTx) is rolled back when the test ends; " +
	"the code under test must not commit it (commit a nested transaction, tx.Begin, instead)")

// Tx is a test's transaction on the migrated schema TxSchema, from NewTx: pass it wherever the
// service takes a pgx.Tx, a keiro.DB (outbox.EnqueueTx, an inbox handler,
// Deliver), and to the assertions, which read through it. Its search_path is TxSchema, so the
// package-level outbox.EnqueueTx and the kit's assertions find the outbox there. It is rolled
// back, and its connection closed, when the test ends.
type Tx struct {
	// Tx is the transaction.
	pgx.Tx
	// Schema is TxSchema: pass it to the components' Schema fields (outbox.NewStore,
	// inbox.StoreConfig.Schema).
	Schema string
}

// Commit refuses to commit the test's transaction: it returns ErrTxCommit and leaves the
// transaction open, so that the test's assertions still see what the code under test wrote.
func (tx *Tx) Commit(context.Context) error { return ErrTxCommit }

// txSchemas remembers, per database URL, the migration of TxSchema.
var txSchemas sync.Map // string -> *txSchema

type txSchema struct {
	once sync.Once
	err  error
}

// NewTx begins a transaction for the fastest tests, as rivertest runs a worker in a test's
// transaction: the service's function runs in it, the kit's assertions (RequireEnqueued,
// RequireNotEnqueued, OutboxRows, Deliver, RequireProcessed, RequireInboxFailed) read through it,
// and it is rolled back when t ends, so nothing is left behind and no schema is created per
// test. The schema is TxSchema on the database of DatabaseURL, migrated by the first NewTx of
// the process. Safe with t.Parallel: each test has a connection of its own and sees only its
// own writes (tests that write the same outbox key, or deliver the same message to the same
// consumer, wait for each other's rollback).
//
// What needs committed rows runs outside it: DrainOutbox and RunConsumer take a NewDB pool.
func NewTx(t testing.TB) *Tx {
	t.Helper()
	const who = "keirotest.NewTx"
	url := DatabaseURL()
	connCfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatalf("%s: parse the test database URL: %v", who, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, _ := txSchemas.LoadOrStore(url, &txSchema{})
	s := v.(*txSchema)
	s.once.Do(func() {
		conn, err := pgx.ConnectConfig(ctx, connCfg.Copy())
		if err != nil {
			s.err = err
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if s.err = migrations.Migrate(ctx, conn, TxSchema); s.err == nil {
			return
		}
		if st, err := migrations.GetStatus(ctx, conn, TxSchema); err == nil && st.Current > st.Latest {
			s.err = fmt.Errorf("%w; the schema was migrated by a newer keiro-go (version %d, this one knows %d): "+
				"drop it, it holds nothing committed (DROP SCHEMA %s CASCADE)", s.err, st.Current, st.Latest, TxSchema)
		}
	})
	if s.err != nil {
		t.Fatalf("%s: migrate schema %s on %s:%d (is PostgreSQL reachable? set KEIRO_TEST_DATABASE_URL or DATABASE_URL "+
			"to a server the tests may create schemas on): %v", who, TxSchema, connCfg.Host, connCfg.Port, s.err)
	}
	cfg := connCfg.Copy()
	cfg.RuntimeParams["search_path"] = TxSchema
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("%s: connect to the test database: %v", who, err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		_ = conn.Close(ctx)
		t.Fatalf("%s: begin the test's transaction: %v", who, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("%s: roll back the test's transaction: %v", who, err)
		}
		_ = conn.Close(ctx)
	})
	return &Tx{Tx: tx, Schema: TxSchema}
}
