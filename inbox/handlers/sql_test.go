package handlers

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// effectsFixture creates, in the test schema, a table of effects and a function apply_event
// that inserts one row per document, raises a serialization failure for payload
// {"mode":"transient"}, a foreign-key violation for {"mode":"missing-parent"},
// KP001 for {"mode":"poison"}, and a class 22 error when "amount" is not a number.
func effectsFixture(t *testing.T, db *testenv.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE TABLE %[1]s.effects (message_id text PRIMARY KEY, amount int NOT NULL, doc jsonb NOT NULL);
CREATE FUNCTION %[1]s.apply_event(doc jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF doc->'payload'->>'mode' = 'transient' THEN
    RAISE EXCEPTION 'ledger busy' USING ERRCODE = '40001';
  END IF;
  IF doc->'payload'->>'mode' = 'missing-parent' THEN
    RAISE EXCEPTION 'no account yet' USING ERRCODE = '23503';
  END IF;
  IF doc->'payload'->>'mode' = 'poison' THEN
    RAISE EXCEPTION 'unknown account %%', doc->>'key' USING ERRCODE = 'KP001';
  END IF;
  INSERT INTO %[1]s.effects VALUES (doc->>'message_id', (doc->'payload'->>'amount')::int, doc);
END $$;`, db.Schema))
	require.NoError(t, err)
}

func runInTx(t *testing.T, db *testenv.DB, h *SQL, ev envelope.Event) error {
	t.Helper()
	var herr error
	err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		herr = h.Handle(context.Background(), tx, ev)
		return herr
	})
	if herr != nil {
		return herr
	}
	require.NoError(t, err)
	return nil
}

func TestSQLCallsFunctionInTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	h, err := NewSQL(SQLConfig{Function: db.Schema + ".apply_event"})
	require.NoError(t, err)
	require.Equal(t, `SELECT "`+db.Schema+`"."apply_event"($1::jsonb)`, h.Query())

	ev := testEvent()
	require.NoError(t, runInTx(t, db, h, ev))

	var amount int
	var key, source string
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT amount, doc->>'key', doc->>'source' FROM `+db.Schema+`.effects WHERE message_id = $1`, ev.MessageID).Scan(&amount, &key, &source))
	require.Equal(t, 42, amount)
	require.Equal(t, "order-7", key)
	require.Equal(t, "ordering", source)

	// The effect belongs to the caller's transaction: a rollback removes it.
	ev.MessageID = "msg-rolled-back"
	tx, err := db.Pool.Begin(context.Background())
	require.NoError(t, err)
	require.NoError(t, h.Handle(context.Background(), tx, ev))
	require.NoError(t, tx.Rollback(context.Background()))
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+db.Schema+`.effects`).Scan(&n))
	require.Equal(t, 1, n)
}

func TestSQLErrorClassification(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	h, err := NewSQL(SQLConfig{Function: db.Schema + ".apply_event"})
	require.NoError(t, err)

	cases := []struct {
		name      string
		payload   string
		permanent bool
		code      string
	}{
		{"transient serialization failure", `{"mode":"transient"}`, false, "40001"},
		{"KP001 raised by the function", `{"mode":"poison"}`, true, "KP001"},
		{"class 22 data exception", `{"amount":"lots"}`, true, "22P02"},
		{"integrity violation is retried", `{}`, false, "23502"},
	}
	for i, tc := range cases {
		ev := testEvent()
		ev.MessageID = fmt.Sprintf("m-%d", i)
		ev.Payload = []byte(tc.payload)
		err := runInTx(t, db, h, ev)
		require.Error(t, err, tc.name)
		require.Equal(t, tc.permanent, inbox.IsPermanent(err), "%s: %v", tc.name, err)
		var pe *pgconn.PgError
		require.True(t, errors.As(err, &pe), tc.name)
		require.Equal(t, tc.code, pe.Code, tc.name)
		require.Contains(t, err.Error(), ev.MessageID)
	}

	ev := testEvent()
	ev.Payload = []byte(`not json`)
	err = runInTx(t, db, h, ev)
	require.ErrorIs(t, err, ErrInvalidJSONPayload)
	require.True(t, inbox.IsPermanent(err))
}

func TestSQLMissingFunctionIsRetryable(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	h, err := NewSQL(SQLConfig{Function: db.Schema + ".not_there"})
	require.NoError(t, err)
	err = runInTx(t, db, h, testEvent())
	require.Error(t, err)
	require.False(t, inbox.IsPermanent(err), "an operator can still create the function: %v", err)
}

func TestSQLFunctionNameValidation(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "a.b.c", "f(); DROP TABLE x", `"quoted"`, "1abc", "schema.", ".fn", "fn--", "f n"} {
		_, err := NewSQL(SQLConfig{Function: bad})
		require.Error(t, err, "%q", bad)
	}
	h, err := NewSQL(SQLConfig{Function: "Billing.Apply_Event$1"})
	require.NoError(t, err)
	require.Equal(t, `SELECT "Billing"."Apply_Event$1"($1::jsonb)`, h.Query())
	h, err = NewSQL(SQLConfig{Function: "apply"})
	require.NoError(t, err)
	require.Equal(t, `SELECT "apply"($1::jsonb)`, h.Query())
}

// TestSQLUndefinedFunctionInsideTheFunctionIsNotAnOutage: SQLSTATE 42883 raised inside the
// function's body (a dynamic call the document chooses) recurs for the same document; only the
// handler's own function being missing is an outage. Before, every 42883 was an outage, retried
// forever without using an attempt.
func TestSQLUndefinedFunctionInsideTheFunctionIsNotAnOutage(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE FUNCTION %[1]s.dispatch(doc jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('SELECT %%I()', doc->'payload'->>'handler');
END $$;`, db.Schema))
	require.NoError(t, err)
	h, err := NewSQL(SQLConfig{Function: db.Schema + ".dispatch"})
	require.NoError(t, err)
	store := newStore(t, db, 2)
	ev := testEvent()
	ev.Payload = []byte(`{"handler":"no_such_handler"}`)
	res, err := store.Process(context.Background(), db.Pool, inbox.Delivery{Event: ev}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome, "%v", res.Err)
	require.False(t, inbox.IsOutage(res.Err), "%v", res.Err)
	require.Equal(t, 1, res.Attempts)
}

// TestSQLBinaryKeyTravelsAsBase64: a key that is not text (a Confluent-framed key starts with a
// NUL byte, which jsonb refuses as \u0000) reaches the function as base64 with
// "key_encoding": "base64". Before, such a key failed the call with SQLSTATE 22P05 on every
// delivery (a NUL) or arrived with U+FFFD in place of its bytes (not UTF-8).
func TestSQLBinaryKeyTravelsAsBase64(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	h, err := NewSQL(SQLConfig{Function: db.Schema + ".apply_event"})
	require.NoError(t, err)
	for i, key := range []string{"\x00\x00\x00\x00\x07order", "order-\xff"} {
		ev := testEvent()
		ev.MessageID = fmt.Sprintf("bin-%d", i)
		ev.Key = &key
		require.NoError(t, runInTx(t, db, h, ev), "%q", key)
		var got []byte
		var enc string
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT decode(doc->>'key', 'base64'), doc->>'key_encoding' FROM `+db.Schema+`.effects WHERE message_id = $1`, ev.MessageID).Scan(&got, &enc))
		require.Equal(t, []byte(key), got)
		require.Equal(t, "base64", enc)
	}
}
