package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/envelope"
)

// The package-level EnqueueTx writes to the outbox its transaction's search_path resolves, else
// to schema "keiro": the rule keirotest's assertions follow too (through ResolveSchema), so a
// test on a keirotest.NewDB pool, whose search_path is the test's schema, asserts on the rows it
// wrote, and a service in production, whose search_path names no outbox, writes to "keiro".

// ErrNoOutbox reports that the package-level EnqueueTx (or ResolveSchema) found no outbox
// table: the search_path resolves no keiro_outbox and schema "keiro" has none. Migrate schema
// "keiro", put a migrated schema on the connection's search_path, or enqueue through a Store
// that names its schema (NewStore).
var ErrNoOutbox = errors.New("outbox: no outbox table on the search_path or in schema \"keiro\"")

// ErrSearchPathChanged reports a package-level EnqueueTx on a connection whose search_path
// resolves another outbox than the one it resolved on the connection's first enqueue, where
// the call's rows were written. The transaction must be rolled back; a retry on the same
// connection writes to the outbox the search_path resolves now. A connection's search_path
// should be set once (in the connection string); a service that switches schemas per
// transaction enqueues through one Store per schema.
var ErrSearchPathChanged = errors.New("outbox: the connection's search_path resolves another outbox than on its first enqueue")

// sqlResolveSchema returns the schema of the keiro_outbox table that the session's
// search_path resolves, else $1 if that schema holds a keiro_outbox, else NULL. Always one row.
const sqlResolveSchema = `SELECT coalesce(
    (SELECT n.nspname::text FROM pg_catalog.pg_class c
     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = to_regclass('keiro_outbox')),
    CASE WHEN to_regclass(quote_ident($1::text) || '.keiro_outbox') IS NOT NULL THEN $1::text END)`

// ResolveSchema returns the schema whose outbox the package-level EnqueueTx writes to through
// q: the schema of the keiro_outbox table that q's search_path resolves (a keirotest.NewDB
// pool's schema), else DefaultSchema. keirotest's assertions find the outbox the same way. It
// returns an error wrapping ErrNoOutbox when neither holds an outbox table.
func ResolveSchema(ctx context.Context, q Querier) (string, error) {
	return defaultOutbox.resolve(ctx, q)
}

// searchPathOutbox is the outbox of the package-level EnqueueTx: the one the transaction's
// search_path resolves, else the one of schema fallback.
//
// Resolving costs a round trip, so it is done once per connection and remembered in the
// connection's CustomData. Every later call checks the remembered schema in the same round
// trip as its insert (the check is pipelined after the enqueue statement), so a connection
// whose search_path changes is reported (ErrSearchPathChanged) instead of writing to another
// schema's outbox unnoticed.
type searchPathOutbox struct {
	fallback string
	stores   sync.Map // schema -> *Store
}

// defaultOutbox serves the package-level EnqueueTx.
var defaultOutbox = &searchPathOutbox{fallback: DefaultSchema}

// connSchemaKey is the CustomData key under which a connection remembers its resolved schema.
const connSchemaKey = "github.com/keiro-go/keiro/outbox.schema"

// resolve runs sqlResolveSchema on q.
func (o *searchPathOutbox) resolve(ctx context.Context, q Querier) (string, error) {
	var found *string
	if err := q.QueryRow(ctx, sqlResolveSchema, o.fallback).Scan(&found); err != nil {
		return "", fmt.Errorf("find the outbox table on the search_path: %w", err)
	}
	if found == nil {
		return "", o.noOutbox()
	}
	return *found, nil
}

// noOutbox is the ErrNoOutbox error, with what to do.
func (o *searchPathOutbox) noOutbox() error {
	return fmt.Errorf("%w: the search_path resolves no keiro_outbox table and schema %q has none; migrate schema %q "+
		"(relay migrate), put a migrated schema on the connection's search_path (keirotest.NewDB's pools have one), "+
		"or enqueue through outbox.NewStore(schema)", ErrNoOutbox, o.fallback, o.fallback)
}

// store returns the Store of schema, creating it on first use.
func (o *searchPathOutbox) store(schema string) (*Store, error) {
	if st, ok := o.stores.Load(schema); ok {
		return st.(*Store), nil
	}
	st, err := NewStore(schema)
	if err != nil {
		return nil, fmt.Errorf("the search_path resolves the outbox of schema %q, which EnqueueTx cannot address "+
			"(%w); enqueue through a Store of a schema it accepts", schema, err)
	}
	actual, _ := o.stores.LoadOrStore(schema, st)
	return actual.(*Store), nil
}

// enqueueTx is Store.enqueueTx on the outbox tx resolves.
func (o *searchPathOutbox) enqueueTx(ctx context.Context, tx pgx.Tx, ids []envelope.UUID, events []envelope.Event) ([]EnqueueResult, error) {
	if len(events) == 0 {
		return nil, nil
	}
	var data map[string]any
	if c := tx.Conn(); c != nil {
		data = c.PgConn().CustomData()
	}
	schema, remembered := data[connSchemaKey].(string)
	if !remembered {
		var err error
		if schema, err = o.resolve(ctx, tx); err != nil {
			return nil, fmt.Errorf("enqueue outbox events: %w", err)
		}
		if data != nil {
			data[connSchemaKey] = schema
		}
	}
	st, err := o.store(schema)
	if err != nil {
		return nil, fmt.Errorf("enqueue outbox events: %w", err)
	}
	var check *pathCheck
	if remembered {
		check = &pathCheck{query: sqlResolveSchema, args: []any{o.fallback}, verify: func(found *string) error {
			if found != nil && *found == schema {
				return nil
			}
			if found == nil {
				delete(data, connSchemaKey)
				return fmt.Errorf("enqueue outbox events: %w: this call wrote to the outbox of schema %q, which the "+
					"connection resolved first; now %v; roll the transaction back", ErrSearchPathChanged, schema, o.noOutbox())
			}
			data[connSchemaKey] = *found
			return fmt.Errorf("enqueue outbox events: %w: this call wrote to the outbox of schema %q, which the "+
				"connection resolved first, but its search_path now resolves schema %q; roll the transaction back "+
				"and retry (the connection now writes to %q), or enqueue through outbox.NewStore(schema)",
				ErrSearchPathChanged, schema, *found, *found)
		}}
	}
	res, err := st.enqueueCheckedTx(ctx, tx, ids, events, check)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateUndefinedTable {
		// The outbox the connection resolved was dropped since (a test's schema, say).
		delete(data, connSchemaKey)
		return nil, fmt.Errorf("enqueue outbox events: %w: the outbox of schema %q, which the connection resolved, "+
			"no longer exists; roll the transaction back and retry: %w", ErrNoOutbox, schema, err)
	}
	return res, err
}

// sqlstateUndefinedTable is PostgreSQL's undefined_table error code.
const sqlstateUndefinedTable = "42P01"

// pathCheck is a query pipelined after an enqueue statement, in the same round trip, and the
// verdict on its one text column.
type pathCheck struct {
	query  string
	args   []any
	verify func(found *string) error
}
