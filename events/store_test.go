package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

func newStore(t testing.TB, db *testenv.DB, cfg ...events.StoreConfig) *events.Store {
	t.Helper()
	var c events.StoreConfig
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.Schema = db.Schema
	s, err := events.NewStore(c)
	require.NoError(t, err)
	return s
}

func ev(typ string, data string) events.EventData {
	return events.EventData{Type: typ, SchemaVersion: 1, Data: json.RawMessage(data)}
}

// appendTx runs AppendTx in its own transaction and commits it.
func appendTx(t testing.TB, db *testenv.DB, s *events.Store, stream string, exp events.ExpectedVersion, evs ...events.EventData) (events.AppendResult, error) {
	t.Helper()
	ctx := context.Background()
	var res events.AppendResult
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = s.AppendTx(ctx, tx, stream, exp, evs...)
		return err
	})
	return res, err
}

func collect(t testing.TB, seq func(func(events.RecordedEvent, error) bool)) []events.RecordedEvent {
	t.Helper()
	var out []events.RecordedEvent
	for e, err := range seq {
		require.NoError(t, err)
		out = append(out, e)
	}
	return out
}

func TestAppendAndRead(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db, events.StoreConfig{PageSize: 2})
	ctx := context.Background()

	corr := envelope.NewUUIDv7()
	first := ev("OrderPlaced", `{"id": "1", "total": 10}`)
	first.Metadata = events.Metadata{CorrelationID: &corr, Extra: json.RawMessage(`{"actor":"agent-7"}`),
		TraceContext: &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "k=v"}}
	res, err := appendTx(t, db, s, "order-1", events.NoStream, first, ev("OrderPaid", `{"id":"1"}`))
	require.NoError(t, err)
	require.Equal(t, int64(2), res.StreamVersion)
	require.Len(t, res.Events, 2)
	require.Equal(t, res.Events[1].GlobalPosition, res.GlobalPosition)
	require.Equal(t, res.Events[0].GlobalPosition+1, res.Events[1].GlobalPosition)

	_, err = appendTx(t, db, s, "order-2", events.Any, ev("OrderPlaced", `{"id":"2"}`))
	require.NoError(t, err)
	_, err = appendTx(t, db, s, "order-1", events.Exact(2), ev("OrderShipped", `{"id":"1"}`))
	require.NoError(t, err)
	_, err = appendTx(t, db, s, "invoice-1", events.Any, ev("InvoiceRaised", `{}`))
	require.NoError(t, err)
	_, err = appendTx(t, db, s, "order-1", events.StreamExists, ev("OrderClosed", `{}`), ev("OrderArchived", `{}`))
	require.NoError(t, err)

	fwd := collect(t, s.ReadStream(ctx, db.Pool, "order-1", events.Forward, 0))
	require.Len(t, fwd, 5)
	for i, e := range fwd {
		require.Equal(t, int64(i+1), e.StreamVersion)
		require.Equal(t, "order", e.Category())
	}
	// The stored event equals the one AppendTx reported, field by field.
	require.Equal(t, res.Events[0].ID, fwd[0].ID)
	require.Equal(t, res.Events[0].GlobalPosition, fwd[0].GlobalPosition)
	// Byte for byte, not only as JSON: a producer fed from AppendResult and a later replay of
	// the stored event must map the same bytes (or the replay is an identity conflict).
	require.Equal(t, string(fwd[0].Data), string(res.Events[0].Data))
	require.Equal(t, string(fwd[1].Data), string(res.Events[1].Data))
	require.Equal(t, string(fwd[0].Metadata.Extra), string(res.Events[0].Metadata.Extra))
	require.Nil(t, res.Events[1].Metadata.Extra)
	require.JSONEq(t, `{"actor":"agent-7"}`, string(fwd[0].Metadata.Extra))
	require.Equal(t, corr, *fwd[0].Metadata.CorrelationID)
	require.Nil(t, fwd[0].Metadata.CausationID)
	require.Equal(t, *first.Metadata.TraceContext, *fwd[0].Metadata.TraceContext)
	require.True(t, res.Events[0].RecordedAt.Equal(fwd[0].RecordedAt))
	require.Nil(t, fwd[1].Metadata.Extra)
	require.Nil(t, fwd[1].Metadata.TraceContext)

	bwd := collect(t, s.ReadStream(ctx, db.Pool, "order-1", events.Backward, 0))
	require.Len(t, bwd, 5)
	require.Equal(t, int64(5), bwd[0].StreamVersion)
	require.Equal(t, int64(1), bwd[4].StreamVersion)
	require.Len(t, collect(t, s.ReadStream(ctx, db.Pool, "order-1", events.Forward, 3)), 2)
	require.Len(t, collect(t, s.ReadStream(ctx, db.Pool, "order-1", events.Backward, 3)), 2)

	all := collect(t, s.ReadAll(ctx, db.Pool, 0))
	require.Len(t, all, 7)
	for i := 1; i < len(all); i++ {
		require.Less(t, all[i-1].GlobalPosition, all[i].GlobalPosition)
	}
	require.Len(t, collect(t, s.ReadAll(ctx, db.Pool, all[2].GlobalPosition)), 4)
	cat := collect(t, s.ReadCategory(ctx, db.Pool, "order", 0))
	require.Len(t, cat, 6)
	require.Len(t, collect(t, s.ReadCategory(ctx, db.Pool, "invoice", 0)), 1)

	head, err := s.Head(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, all[6].GlobalPosition, head)

	// Breaking out of an iteration early is fine.
	for _, err := range s.ReadAll(ctx, db.Pool, 0) {
		require.NoError(t, err)
		break
	}
}

func TestAppendExpectedVersion(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)

	cases := []struct {
		name     string
		stream   string
		setup    int // events appended first
		expected events.ExpectedVersion
		ok       bool
		actual   int64
	}{
		{"no stream on empty", "a-1", 0, events.NoStream, true, 0},
		{"no stream on existing", "a-2", 1, events.NoStream, false, 1},
		{"exists on empty", "a-3", 0, events.StreamExists, false, 0},
		{"exists on existing", "a-4", 2, events.StreamExists, true, 0},
		{"exact match", "a-5", 2, events.Exact(2), true, 0},
		{"exact behind", "a-6", 3, events.Exact(2), false, 3},
		{"exact ahead", "a-7", 1, events.Exact(2), false, 1},
		{"exact on empty", "a-8", 0, events.Exact(1), false, 0},
		{"exact zero is no stream", "a-9", 0, events.Exact(0), true, 0},
		{"any on existing", "a-10", 2, events.Any, true, 0},
	}
	for _, c := range cases {
		for i := 0; i < c.setup; i++ {
			_, err := appendTx(t, db, s, c.stream, events.Any, ev("E", `{}`))
			require.NoError(t, err)
		}
		res, err := appendTx(t, db, s, c.stream, c.expected, ev("E", `{}`))
		if c.ok {
			require.NoError(t, err, c.name)
			require.Equal(t, int64(c.setup+1), res.StreamVersion, c.name)
			continue
		}
		require.ErrorIs(t, err, events.ErrWrongExpectedVersion, c.name)
		var wev *events.WrongExpectedVersionError
		require.True(t, errors.As(err, &wev), c.name)
		require.Equal(t, c.actual, wev.Actual, c.name)
		require.Equal(t, c.stream, wev.Stream)
		n := len(collect(t, s.ReadStream(context.Background(), db.Pool, c.stream, events.Forward, 0)))
		require.Equal(t, c.setup, n, "%s: nothing appended on conflict", c.name)
	}

	// A conflict leaves the transaction usable.
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := s.AppendTx(ctx, tx, "a-2", events.NoStream, ev("E", `{}`))
		require.ErrorIs(t, err, events.ErrWrongExpectedVersion)
		_, err = s.AppendTx(ctx, tx, "a-2", events.Exact(1), ev("E", `{}`))
		return err
	})
	require.NoError(t, err)
}

func TestAppendIdempotentIDs(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	id1, id2 := envelope.NewUUIDv7(), envelope.NewUUIDv7()
	a := ev("Added", `{"n": 1, "m": 2}`)
	a.ID = id1
	b := ev("Added", `{"n": 2}`)
	b.ID = id2
	first, err := appendTx(t, db, s, "counter-1", events.NoStream, a, b)
	require.NoError(t, err)
	require.False(t, first.Duplicate)

	// Same ids, same content (key order and spacing differ: jsonb equality) → no-op success.
	a2 := a
	a2.Data = json.RawMessage(`{"m":2,"n":1}`)
	again, err := appendTx(t, db, s, "counter-1", events.Exact(2), a2, b)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.GlobalPosition, again.GlobalPosition)
	require.Equal(t, int64(2), again.StreamVersion)
	require.Len(t, collect(t, s.ReadStream(context.Background(), db.Pool, "counter-1", events.Forward, 0)), 2)

	// Different content, another stream, or a partial batch → conflict.
	c := a
	c.Data = json.RawMessage(`{"n": 9}`)
	_, err = appendTx(t, db, s, "counter-1", events.Any, c)
	require.ErrorIs(t, err, events.ErrEventIDConflict)
	_, err = appendTx(t, db, s, "counter-2", events.Any, a)
	require.ErrorIs(t, err, events.ErrEventIDConflict)
	fresh := ev("Added", `{"n": 3}`)
	fresh.ID = envelope.NewUUIDv7()
	_, err = appendTx(t, db, s, "counter-1", events.Any, a, fresh)
	require.ErrorIs(t, err, events.ErrEventIDConflict)
	require.Len(t, collect(t, s.ReadStream(context.Background(), db.Pool, "counter-1", events.Forward, 0)), 2)
}

func TestAppendRejectsBadInput(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	for _, name := range []string{"order", "-1", "order- ", "$all-1", "ord er-1", "a\x01-1", ""} {
		_, err := appendTx(t, db, s, name, events.Any, ev("E", `{}`))
		require.ErrorIs(t, err, events.ErrInvalidStreamName, name)
	}
	_, err := appendTx(t, db, s, "order-1", events.Any)
	require.Error(t, err)
	_, err = appendTx(t, db, s, "order-1", events.Any, ev("", `{}`), ev("E", `{not json`))
	require.ErrorContains(t, err, "Type is empty")
	require.ErrorContains(t, err, "not valid JSON")
	require.NoError(t, events.ValidateStreamName("wf:fulfillment-a-b"))

	_, err = events.NewStore(events.StoreConfig{Schema: "Bad-Schema", PageSize: -1})
	require.ErrorContains(t, err, "Schema")
	require.ErrorContains(t, err, "PageSize")
}

func TestRolledBackAppendLeavesNothing(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	ctx := context.Background()
	boom := fmt.Errorf("boom")
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := s.AppendTx(ctx, tx, "order-1", events.NoStream, ev("E", `{}`)); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Empty(t, collect(t, s.ReadAll(ctx, db.Pool, 0)))
	res, err := appendTx(t, db, s, "order-1", events.NoStream, ev("E", `{}`))
	require.NoError(t, err)
	require.Equal(t, int64(1), res.StreamVersion)
}
