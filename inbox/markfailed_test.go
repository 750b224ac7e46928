package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestInbox_MarkFailedTxIsPreserved is keiro's "Keiro.Inbox": "exports markFailedTx from the
// public inbox module and preserves explicit failure marks". A handler that marks its own row
// failed with a reason commits its writes with the mark; the inbox does not complete the row,
// on a first delivery nor on the rerun of a row an earlier attempt left failed, alone or in a
// batch; a redelivery does not run the handler again; an operator's Reprocess does.
func TestInbox_MarkFailedTxIsPreserved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db)
	admin := inbox.NewAdmin(s)
	marking := func(reason string) inbox.Handler {
		return func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			if err := fx.handler()(ctx, tx, ev); err != nil {
				return err
			}
			return inbox.MarkFailedTx(ctx, tx, reason)
		}
	}
	lookup := func(ev envelope.Event) inbox.Entry {
		t.Helper()
		e, err := admin.Lookup(ctx, db.Pool, inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID})
		require.NoError(t, err)
		return e
	}

	// A first delivery: processed, its effect committed, its row failed with the reason.
	ev := newEvent("ordering", "billing.orders.v1")
	res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, marking("operator failed"))
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, 1, fx.count(t, ev.MessageID))
	e := lookup(ev)
	require.Equal(t, inbox.StatusFailed, e.Status)
	require.Equal(t, "operator failed", e.LastError)
	require.True(t, e.Poisoned)
	require.Nil(t, e.CompletedAt)
	require.NotNil(t, e.FailedAt)

	// A redelivery does not run the handler again.
	ran := false
	res, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, func(context.Context, pgx.Tx, envelope.Event) error { ran = true; return nil })
	require.NoError(t, err)
	require.Equal(t, inbox.PreviouslyFailed, res.Outcome)
	require.False(t, ran)
	require.ErrorContains(t, res.Err, "operator failed")

	// An operator's Reprocess runs it, and a handler that does not mark completes the row.
	res, err = admin.Reprocess(ctx, db.Pool, inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID}, fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, inbox.StatusCompleted, lookup(ev).Status)
	require.Equal(t, 2, fx.count(t, ev.MessageID))

	// The rerun of a row a failed attempt left: the mark is kept, not overwritten by completion.
	rerun := newEvent("ordering", "billing.orders.v1")
	res, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: rerun}, func(context.Context, pgx.Tx, envelope.Event) error {
		return errors.New("downstream said no")
	})
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
	res, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: rerun}, marking("judged bad on retry"))
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	e = lookup(rerun)
	require.Equal(t, inbox.StatusFailed, e.Status)
	require.Equal(t, "judged bad on retry", e.LastError)
	require.Equal(t, 1, fx.count(t, rerun.MessageID))

	// In a batch, each handler marks its own row only.
	a, b := newEvent("ordering", "t"), newEvent("ordering", "t")
	results, err := s.ProcessBatch(ctx, db.Pool, []inbox.Delivery{{Event: a}, {Event: b}}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if ev.MessageID == b.MessageID {
			return marking("b is bad")(ctx, tx, ev)
		}
		return fx.handler()(ctx, tx, ev)
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, results[0].Outcome)
	require.Equal(t, inbox.Processed, results[1].Outcome)
	require.Equal(t, inbox.StatusCompleted, lookup(a).Status)
	require.Equal(t, inbox.StatusFailed, lookup(b).Status)
	require.Equal(t, "b is bad", lookup(b).LastError)
}

// TestInbox_MarkFailedTxOutsideAHandler: MarkFailedTx refuses a transaction that is not a single
// message's handler transaction (a nested one, a plain one, a BatchHandler's of several
// messages) and writes nothing. ProcessBatchWith then runs the batch one message per
// transaction, where the mark applies to each message's own row.
func TestInbox_MarkFailedTxOutsideAHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	a, b := newEvent("ordering", "t"), newEvent("ordering", "t")
	var sizes []int
	results, err := s.ProcessBatchWith(ctx, db.Pool, []inbox.Delivery{{Event: a}, {Event: b}}, func(ctx context.Context, tx pgx.Tx, evs []envelope.Event) error {
		err := inbox.MarkFailedTx(ctx, tx, "bad batch member")
		sizes = append(sizes, len(evs))
		if len(evs) > 1 {
			require.ErrorIs(t, err, inbox.ErrNotHandlerTx)
		}
		return err
	})
	require.NoError(t, err)
	require.Equal(t, []int{2, 1, 1}, sizes)
	admin := inbox.NewAdmin(s)
	for i, ev := range []envelope.Event{a, b} {
		require.Equal(t, inbox.Processed, results[i].Outcome)
		e, err := admin.Lookup(ctx, db.Pool, inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID})
		require.NoError(t, err)
		require.Equal(t, inbox.StatusFailed, e.Status)
		require.Equal(t, "bad batch member", e.LastError)
	}
	c := newEvent("ordering", "t")
	res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: c}, func(ctx context.Context, tx pgx.Tx, _ envelope.Event) error {
		nested, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = nested.Rollback(ctx) }()
		return inbox.MarkFailedTx(ctx, nested, "nested")
	})
	require.NoError(t, err)
	require.ErrorIs(t, res.Err, inbox.ErrNotHandlerTx)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		require.ErrorIs(t, inbox.MarkFailedTx(ctx, tx, "plain"), inbox.ErrNotHandlerTx)
		return nil
	}))
}

// TestInbox_MarkFailedTxStoresAnyReason: a reason PostgreSQL's text refuses as it is (a NUL
// byte, invalid UTF-8) or longer than the stored limit is stored readable and cut, so that the
// mark, and the handler's writes with it, still commit.
func TestInbox_MarkFailedTxStoresAnyReason(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db)
	ev := newEvent("ordering", "t")
	reason := "bad\x00byte \xff and " + strings.Repeat("long ", 4000)
	res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if err := fx.handler()(ctx, tx, ev); err != nil {
			return err
		}
		return inbox.MarkFailedTx(ctx, tx, reason)
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, 1, fx.count(t, ev.MessageID))
	e, err := inbox.NewAdmin(s).Lookup(ctx, db.Pool, inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusFailed, e.Status)
	require.True(t, strings.HasPrefix(e.LastError, "bad\uFFFDbyte \uFFFD and long"), e.LastError[:20])
	require.Less(t, len(e.LastError), len(reason))
}
