package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/internal/logmsg"
)

// EmitTx writes nothing that no relay would read: on a schema in claim mode it returns
// ErrEmitNeedsLogMode, at REPEATABLE READ ErrEmitIsolation, for an invalid event the
// validation's problems; even when the caller commits after the error, no message is in the
// WAL. In log mode at READ COMMITTED its events are messages of the schema's prefix, in order,
// and a transaction that emitted holds a switch back to claim mode until it ends.
func TestEmitTxRefusesWhatNoRelayWouldRead(t *testing.T) {
	t.Parallel()
	db, _, st := rig(t, 1)
	ctx := context.Background()
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	slot := db.Schema + "_emit_check"
	_, err = conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding', true)`, slot)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot) }()
	prefix := "keiro.outbox:" + db.Schema
	messages := func() []string {
		rows, err := conn.Query(ctx, `SELECT data FROM pg_logical_slot_peek_changes($1, NULL, NULL)
			WHERE data LIKE 'message: transactional: 1 prefix: ' || $2 || ',%'`, slot, prefix)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	emitCommit := func(opts pgx.TxOptions, evs ...envelope.Event) error {
		tx, err := db.Pool.BeginTx(ctx, opts)
		require.NoError(t, err)
		emitErr := st.EmitTx(ctx, tx, evs...)
		require.NoError(t, tx.Commit(ctx), "the refusals are no SQL errors: the caller may commit")
		return emitErr
	}

	err = emitCommit(pgx.TxOptions{}, event("claim", "orders", ptr("k"), `{}`))
	require.ErrorIs(t, err, outbox.ErrEmitNeedsLogMode)
	require.ErrorContains(t, err, "is in claim mode")

	_, err = outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeLog, "")
	require.NoError(t, err)
	err = emitCommit(pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, event("rr", "orders", ptr("k"), `{}`))
	require.ErrorIs(t, err, outbox.ErrEmitIsolation)
	err = emitCommit(pgx.TxOptions{IsoLevel: pgx.Serializable}, event("ser", "orders", ptr("k"), `{}`))
	require.ErrorIs(t, err, outbox.ErrEmitIsolation)
	bad := event("bad", "orders", ptr("k"), `{}`)
	bad.Source = ""
	err = emitCommit(pgx.TxOptions{}, event("good", "orders", ptr("k"), `{}`), bad)
	require.ErrorContains(t, err, `event 1 (message id "bad")`)
	require.Empty(t, messages(), "nothing emitted by a refused call")

	// test_decoding prints a message's size, not its binary content: ids of three lengths
	// tell the messages apart.
	evs := []envelope.Event{event("a", "orders", ptr("k"), `{}`), event("bb", "orders", ptr("k"), `{}`),
		event("ccc", "orders", ptr("k"), `{}`)}
	require.NoError(t, emitCommit(pgx.TxOptions{}, evs[0]))
	require.NoError(t, emitCommit(pgx.TxOptions{}, evs[1:]...))
	got := messages()
	require.Len(t, got, 3)
	for i := range evs {
		require.Contains(t, got[i], fmt.Sprintf(", sz: %d ", len(logmsg.Append(nil, &evs[i], nil))), "message %d", i)
	}
	require.Zero(t, count(t, db.Pool, "keiro_outbox_log")+count(t, db.Pool, "keiro_outbox"), "no row")

	// The switch back to claim waits for a transaction that emitted.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, st.EmitTx(ctx, tx, event("held", "orders", ptr("k"), `{}`)))
	switched := make(chan error, 1)
	go func() {
		_, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeClaim, "")
		switched <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks
			WHERE relation = 'keiro_outbox'::regclass AND mode = 'ShareLock' AND NOT granted)`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 10*time.Millisecond, "the switch waits for the transaction that emitted")
	select {
	case err := <-switched:
		t.Fatalf("the switch ended (%v) while a transaction that emitted was open", err)
	default:
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-switched)
	require.Len(t, messages(), 4)
	err = emitCommit(pgx.TxOptions{}, event("after", "orders", ptr("k"), `{}`))
	require.ErrorIs(t, err, outbox.ErrEmitNeedsLogMode)
	require.Len(t, messages(), 4)
}

// A log-mode relay publishes emitted events with the envelope EnqueueTx's rows get, and a
// message of the schema's prefix that does not decode becomes a dead letter of keiro_outbox
// (relay dead list) with code undecodable_message, while the stream goes on.
func TestEmitTxPublishedByTheLogRelay(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	ctx := context.Background()
	startLogRelay(t, db, kc, st, outbox.RelayConfig{})
	waitSlotRead(t, db, st)

	full := event("emitted", "orders", ptr("k"), `{"n":1}`)
	full.SchemaVersion = 3
	full.Attributes = []byte(`{"tenant": "t1"}`)
	full.TraceContext = &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "k=v"}
	row := full
	row.MessageID = "enqueued"
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := st.EmitTx(ctx, tx, full); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, '\x09'::bytea)`, "keiro.outbox:"+db.Schema); err != nil {
			return err
		}
		_, err := st.EnqueueTx(ctx, tx, row)
		return err
	}))
	recs := kc.ConsumeRecords(t, 2, time.Minute, "orders")
	require.Equal(t, []string{"emitted", "enqueued"}, recordIDs(t, recs))
	require.Equal(t, len(recs[1].Headers), len(recs[0].Headers))
	for i, h := range recs[0].Headers {
		require.Equal(t, recs[1].Headers[i].Key, h.Key)
		if h.Key != "keiro-message-id" {
			require.Equal(t, string(recs[1].Headers[i].Value), string(h.Value), h.Key)
		}
	}
	require.Equal(t, recs[1].Value, recs[0].Value)

	var dead outbox.DeadRow
	require.Eventually(t, func() bool {
		rows, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{})
		require.NoError(t, err)
		for _, r := range rows {
			if strings.HasPrefix(r.MessageID, "logical-message/") {
				dead = r
				return true
			}
		}
		return false
	}, time.Minute, 20*time.Millisecond, "the undecodable message's dead letter")
	require.Equal(t, "undecodable_message", dead.RejectionCode)
	require.Contains(t, dead.LastError, "unknown format version 9")
}

// waitSlotRead waits until a walsender reads the schema's default slot: a slot decodes only
// what commits after its creation ended (while it is created, the creating backend is its
// active pid).
func waitSlotRead(t *testing.T, db *testenv.DB, st *outbox.Store) {
	t.Helper()
	ctx := context.Background()
	testenv.WaitFor(t, time.Minute, "a walsender reads the slot", func() bool {
		ss, err := outbox.AdminOf(st).LogSlotStatus(ctx, db.Pool, "")
		if err != nil || !ss.Exists || ss.ActivePID == 0 {
			return false
		}
		var walsender bool
		err = db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE pid = $1 AND backend_type = 'walsender')`, ss.ActivePID).Scan(&walsender)
		return err == nil && walsender
	})
}

// EmitTx accepts exactly what EnqueueTx can store: an event whose text holds a NUL character
// (which no PostgreSQL text column stores) or whose attributes hold \u0000 (which jsonb
// refuses) is refused up front, naming the field, and nothing of the call is emitted; EnqueueTx
// refuses the same events. Were such an event emitted, its dead letter, a row of keiro_outbox,
// could never be written.
func TestEmitTxRefusesWhatNoRowCouldHold(t *testing.T) {
	t.Parallel()
	db, _, st := rig(t, 1)
	ctx := context.Background()
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	_, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeLog, "")
	require.NoError(t, err)
	nul := "a\x00b"
	for _, tc := range []struct {
		field string
		bad   func(e *envelope.Event)
	}{
		{"MessageID", func(e *envelope.Event) { e.MessageID = nul }},
		{"Source", func(e *envelope.Event) { e.Source = nul }},
		{"Key", func(e *envelope.Event) { e.Key = &nul }},
		{"EventType", func(e *envelope.Event) { e.EventType = nul }},
		{"ContentType", func(e *envelope.Event) { e.ContentType = nul }},
		{"SchemaRef.Subject", func(e *envelope.Event) { e.SchemaRef = &envelope.SchemaRef{Subject: &nul} }},
		{"TraceContext.Tracestate", func(e *envelope.Event) {
			e.TraceContext = &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: nul}
		}},
		{"Attributes", func(e *envelope.Event) { e.Attributes = []byte(`{"note":"a\u0000b"}`) }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			bad := event("bad-"+tc.field, "orders", ptr("k"), `{}`)
			tc.bad(&bad)
			good := event("good-"+tc.field, "orders", ptr("k"), `{}`)
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			err = st.EmitTx(ctx, tx, good, bad)
			require.ErrorContains(t, err, "event 1 (message id ")
			require.ErrorContains(t, err, tc.field)
			require.NoError(t, tx.Rollback(ctx))

			err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := st.EnqueueTx(ctx, tx, bad)
				return err
			})
			require.Error(t, err, "EnqueueTx refuses the same event")
		})
	}
	require.Zero(t, count(t, db.Pool, "keiro_outbox_log")+count(t, db.Pool, "keiro_outbox"), "no row")

	// An escaped backslash before u0000 is text, which jsonb stores: accepted by both.
	for i, attrs := range []string{`{"note":"\\u0000"}`, `{"u0000":"\\\\u0000 and u0000"}`} {
		ok := event(fmt.Sprintf("escaped-%d", i), "orders", ptr("k"), `{}`)
		ok.Attributes = []byte(attrs)
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return st.EmitTx(ctx, tx, ok) }), attrs)
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := st.EnqueueTx(ctx, tx, ok)
			return err
		}), attrs)
		_, err = db.Pool.Exec(ctx, "DELETE FROM keiro_outbox_log")
		require.NoError(t, err)
	}
}
