package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

func TestProcessThenDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db)
	ev := newEvent("ordering", "billing.orders.v1")
	d := inbox.Delivery{Event: ev, Kafka: &inbox.KafkaRef{Topic: "billing.orders.v1", Partition: 2, Offset: 17}}

	res, err := s.Process(ctx, db.Pool, d, fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, ev.MessageID, res.DedupeKey)
	require.Equal(t, 1, fx.count(t, ev.MessageID))

	res, err = s.Process(ctx, db.Pool, d, fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, res.Outcome)
	require.Equal(t, 1, fx.count(t, ev.MessageID))

	e, err := inbox.NewAdmin(s).Lookup(ctx, db.Pool, inbox.Key{Source: "ordering", DedupeKey: ev.MessageID})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusCompleted, e.Status)
	require.NotNil(t, e.CompletedAt)
	require.Equal(t, ev.Payload, e.Delivery.Event.Payload)
	require.Equal(t, *ev.Key, *e.Delivery.Event.Key)
	require.Equal(t, ev.TraceContext, e.Delivery.Event.TraceContext)
	require.Equal(t, *ev.SourceEventID, *e.Delivery.Event.SourceEventID)
	require.True(t, ev.OccurredAt.Equal(e.Delivery.Event.OccurredAt))
	require.JSONEq(t, string(ev.Attributes), string(e.Delivery.Event.Attributes))
	require.Equal(t, d.Kafka, e.Delivery.Kafka)

	// Another consumer sharing the database is not deduplicated by billing's row.
	other := newStore(t, db, func(c *inbox.StoreConfig) { c.Consumer = "shipping" })
	res, err = other.Process(ctx, db.Pool, d, fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, 2, fx.count(t, ev.MessageID))
}

func TestDedupePolicies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)

	t.Run("SourceEventIdentity", func(t *testing.T) {
		s := newStore(t, db, func(c *inbox.StoreConfig) { c.DedupePolicy = inbox.DedupeSourceEventIdentity })
		a := newEvent("ordering", "t")
		b := newEvent("ordering", "t")
		b.SourceEventID = a.SourceEventID
		r, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: a}, fx.handler())
		require.NoError(t, err)
		require.Equal(t, inbox.Processed, r.Outcome)
		require.Equal(t, a.SourceEventID.String(), r.DedupeKey)
		r, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: b}, fx.handler())
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, r.Outcome)

		c := newEvent("ordering", "t")
		c.SourceEventID, c.SourceGlobalPosition = nil, nil
		_, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: c}, fx.handler())
		require.ErrorIs(t, err, inbox.ErrDedupePolicyUnsatisfied)
		var pe *inbox.DedupePolicyError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, "SourceEventIdentity", pe.Policy)
		require.Equal(t, 0, fx.count(t, c.MessageID))
	})
	t.Run("KafkaDelivery", func(t *testing.T) {
		s := newStore(t, db, func(c *inbox.StoreConfig) {
			c.DedupePolicy = inbox.DedupeKafkaDelivery
			c.Consumer = "kafka-keyed"
		})
		ref := &inbox.KafkaRef{Topic: "billing.orders.v1", Partition: 0, Offset: 17}
		r, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: newEvent("ordering", "t"), Kafka: ref}, fx.handler())
		require.NoError(t, err)
		require.Equal(t, "billing.orders.v1:0:17", r.DedupeKey)
		r, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: newEvent("ordering", "t"), Kafka: ref}, fx.handler())
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, r.Outcome)
		_, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: newEvent("ordering", "t")}, fx.handler())
		require.ErrorIs(t, err, inbox.ErrDedupePolicyUnsatisfied)
	})
	t.Run("Custom", func(t *testing.T) {
		s := newStore(t, db, func(c *inbox.StoreConfig) {
			c.Consumer = "custom"
			c.DedupePolicy = inbox.DedupeCustom(func(d inbox.Delivery) (string, error) {
				if d.Event.EventType == "" {
					return "", errors.New("no type")
				}
				return d.Event.EventType + "/" + string(d.Event.Payload), nil
			})
		})
		a := newEvent("ordering", "t")
		b := newEvent("ordering", "t")
		b.Payload = a.Payload
		r, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: a}, fx.handler())
		require.NoError(t, err)
		require.Equal(t, inbox.Processed, r.Outcome)
		r, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: b}, fx.handler())
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, r.Outcome)
		b.EventType = ""
		_, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: b}, fx.handler())
		require.ErrorIs(t, err, inbox.ErrDedupePolicyUnsatisfied)
		require.ErrorContains(t, err, "no type")
	})
	t.Run("MessageIDEmpty", func(t *testing.T) {
		s := newStore(t, db)
		ev := newEvent("ordering", "t")
		ev.MessageID = ""
		_, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, fx.handler())
		require.ErrorIs(t, err, inbox.ErrDedupePolicyUnsatisfied)
	})
}

// Two processes (two pools) deliver the same message at once; the first handler blocks inside
// its transaction until the second has reached the database. Effects commit exactly once.
func TestConcurrentDeliveriesRunEffectsOnce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s1, s2 := newStore(t, db), newStore(t, db)
	ev := newEvent("ordering", "t")

	// Release the first handler once the second insert is waiting on the row lock.
	r1, r2, ran2 := raceDeliveries(t, db, fx, s1, s2, ev, `INSERT INTO `+db.Schema+`.keiro_inbox%`)
	require.Equal(t, inbox.Processed, r1.Outcome)
	require.Equal(t, inbox.Duplicate, r2.Outcome)
	require.Zero(t, ran2)
	require.Equal(t, 1, fx.count(t, ev.MessageID))
}

func TestHandlerFailureRetryAndPoison(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.Persistence = inbox.DedupeOnly })
	boom := errors.New("downstream said no")
	failing := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if err := fx.handler()(ctx, tx, ev); err != nil {
			return err
		}
		return boom
	}
	ev := newEvent("ordering", "t")
	d := inbox.Delivery{Event: ev}
	k := inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID}

	for attempt := 1; attempt <= 2; attempt++ {
		res, err := s.Process(ctx, db.Pool, d, failing)
		require.NoError(t, err)
		require.Equal(t, inbox.HandlerFailed, res.Outcome, "attempt %d", attempt)
		require.Equal(t, attempt, res.Attempts)
		require.ErrorIs(t, res.Err, boom)
		require.Equal(t, 0, fx.count(t, ev.MessageID), "effects rolled back")
		e, err := inbox.NewAdmin(s).Lookup(ctx, db.Pool, k)
		require.NoError(t, err)
		require.Equal(t, inbox.StatusFailed, e.Status)
		require.Equal(t, attempt, e.Attempts)
		require.Contains(t, e.LastError, "downstream said no")
		// The failure path stores the full envelope even in DedupeOnly mode.
		require.Equal(t, ev.Payload, e.Delivery.Event.Payload)
		require.NotNil(t, e.Delivery.Event.TraceContext)
	}
	res, err := s.Process(ctx, db.Pool, d, failing)
	require.NoError(t, err)
	require.Equal(t, inbox.Poisoned, res.Outcome)
	require.Equal(t, 3, res.Attempts)

	ran := false
	res, err = s.Process(ctx, db.Pool, d, func(context.Context, pgx.Tx, envelope.Event) error { ran = true; return nil })
	require.NoError(t, err)
	require.Equal(t, inbox.PreviouslyFailed, res.Outcome)
	require.False(t, ran)
	require.ErrorContains(t, res.Err, "downstream said no")

	n, err := s.CountFailed(ctx, db.Pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

func TestTransientFailureThenSuccessKeepsAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.Persistence = inbox.DedupeOnly })
	ev := newEvent("ordering", "t")
	calls := 0
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		calls++
		if calls == 1 {
			return errors.New("transient")
		}
		return fx.handler()(ctx, tx, ev)
	}
	res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h)
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
	res, err = s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h)
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, 1, res.Attempts)
	require.Equal(t, 1, fx.count(t, ev.MessageID))
	e, err := inbox.NewAdmin(s).Lookup(ctx, db.Pool, inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusCompleted, e.Status)
	require.Equal(t, 1, e.Attempts)
	require.Empty(t, e.Delivery.Event.Payload, "DedupeOnly drops the payload once completed")
	require.Empty(t, e.LastError)
}

func TestDedupeOnlyStoresNoPayload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.Persistence = inbox.DedupeOnly })
	ev := newEvent("ordering", "t")
	v := int64(3)
	ev.SchemaRef = &envelope.SchemaRef{Version: &v}
	d := inbox.Delivery{Event: ev, Kafka: &inbox.KafkaRef{Topic: "t", Partition: 1, Offset: 9}}
	res, err := s.Process(ctx, db.Pool, d, fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	e, err := inbox.NewAdmin(s).Lookup(ctx, db.Pool, inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID})
	require.NoError(t, err)
	got := e.Delivery.Event
	require.Empty(t, got.Payload)
	require.Nil(t, got.Attributes)
	require.Nil(t, got.TraceContext)
	require.Nil(t, got.SchemaRef)
	require.Equal(t, ev.MessageID, got.MessageID)
	require.Equal(t, *ev.SourceEventID, *got.SourceEventID)
	require.Equal(t, *ev.SourceGlobalPosition, *got.SourceGlobalPosition)
	require.True(t, ev.OccurredAt.Equal(got.OccurredAt))
	require.Equal(t, d.Kafka, e.Delivery.Kafka)
	var raw []byte
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT payload_bytes FROM `+db.Schema+`.keiro_inbox`).Scan(&raw))
	require.Empty(t, raw)

	res, err = s.Process(ctx, db.Pool, d, fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, res.Outcome)
}

// TestDedupeOnlyTransientFailureIsNotUnstorable: in DedupeOnly mode the completed row leaves
// out the trace context and the attributes, so a tracestate with invalid UTF-8 and attributes
// with \u0000 complete fine; a transient failure first must record its attempt too (with the
// refused characters replaced) instead of failing as unstorable, which dead-lettered the message.
func TestDedupeOnlyTransientFailureIsNotUnstorable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.Persistence = inbox.DedupeOnly })
	ev := newEvent("ordering", "t")
	ev.TraceContext.Tracestate = "k=\xff\xfe"
	ev.Attributes = []byte(`{"note":"a\u0000b","n\u0000":[1.50,"\u0000"]}`)
	d := inbox.Delivery{Event: ev}
	res, err := s.Process(ctx, db.Pool, d, func(context.Context, pgx.Tx, envelope.Event) error {
		return errors.New("ledger busy")
	})
	require.NoError(t, err, "recording the failure must not fail as unstorable")
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
	e, err := inbox.NewAdmin(s).Lookup(ctx, db.Pool, inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusFailed, e.Status)
	require.Equal(t, ev.Payload, e.Delivery.Event.Payload, "the failed row keeps the payload")
	require.Equal(t, "k=\uFFFD", e.Delivery.Event.TraceContext.Tracestate)
	require.JSONEq(t, `{"note":"a\uFFFDb","n\uFFFD":[1.50,"\uFFFD"]}`, string(e.Delivery.Event.Attributes))

	res, err = s.Process(ctx, db.Pool, d, fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, 1, res.Attempts)
	require.Equal(t, 1, fx.count(t, ev.MessageID))
}

func TestPermanentPanicAndBrokenTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db)

	cases := []struct {
		name    string
		h       inbox.Handler
		outcome inbox.Outcome
		check   func(t *testing.T, err error)
	}{
		{"permanent", func(context.Context, pgx.Tx, envelope.Event) error {
			return inbox.Permanent(errors.New("unknown customer"))
		}, inbox.Poisoned, func(t *testing.T, err error) {
			require.True(t, inbox.IsPermanent(err))
			require.ErrorContains(t, err, "unknown customer")
		}},
		{"panic", func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			_ = fx.handler()(ctx, tx, ev)
			panic("nil map somewhere")
		}, inbox.HandlerFailed, func(t *testing.T, err error) {
			var pe *inbox.PanicError
			require.ErrorAs(t, err, &pe)
			require.Equal(t, "nil map somewhere", pe.Value)
		}},
		{"sql error swallowed", func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			_ = fx.handler()(ctx, tx, ev)
			_, _ = tx.Exec(ctx, `SELECT 1/0`)
			return nil
		}, inbox.HandlerFailed, func(t *testing.T, err error) { require.ErrorIs(t, err, inbox.ErrTxAborted) }},
		{"handler rolled back", func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			_ = fx.handler()(ctx, tx, ev)
			return tx.Rollback(ctx)
		}, inbox.HandlerFailed, func(t *testing.T, err error) { require.ErrorIs(t, err, inbox.ErrHandlerRolledBack) }},
		{"handler tried to commit", func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			_ = fx.handler()(ctx, tx, ev)
			return tx.Commit(ctx)
		}, inbox.HandlerFailed, func(t *testing.T, err error) { require.ErrorIs(t, err, inbox.ErrTxOwned) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := newEvent("ordering", "t")
			res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, tc.h)
			require.NoError(t, err)
			require.Equal(t, tc.outcome, res.Outcome)
			require.Equal(t, 1, res.Attempts)
			tc.check(t, res.Err)
			require.Equal(t, 0, fx.count(t, ev.MessageID), "no effect may survive")
			e, err := inbox.NewAdmin(s).Lookup(ctx, db.Pool, inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID})
			require.NoError(t, err)
			require.Equal(t, inbox.StatusFailed, e.Status)
		})
	}

	// A savepoint inside the handler may be committed (released) freely.
	ev := newEvent("ordering", "t")
	res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := fx.handler()(ctx, sp, ev); err != nil {
			return err
		}
		return sp.Commit(ctx)
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, 1, fx.count(t, ev.MessageID))
}

func TestProcessBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db)

	t.Run("distinct and in-batch duplicates", func(t *testing.T) {
		var ds []inbox.Delivery
		for range 50 {
			ds = append(ds, inbox.Delivery{Event: newEvent("ordering", "t")})
		}
		ds = append(ds, ds[3], ds[7])
		res, err := s.ProcessBatch(ctx, db.Pool, ds, fx.handler())
		require.NoError(t, err)
		require.Len(t, res, 52)
		for i, r := range res {
			want := inbox.Processed
			if i >= 50 {
				want = inbox.Duplicate
			}
			require.Equal(t, want, r.Outcome, "item %d", i)
		}
		for _, d := range ds {
			require.Equal(t, 1, fx.count(t, d.Event.MessageID))
		}
		res, err = s.ProcessBatch(ctx, db.Pool, ds[:2], fx.handler())
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, res[0].Outcome)
		require.Equal(t, inbox.Duplicate, res[1].Outcome)
	})

	t.Run("poison in the middle", func(t *testing.T) {
		var ds []inbox.Delivery
		for range 5 {
			ds = append(ds, inbox.Delivery{Event: newEvent("ordering", "t")})
		}
		poison := ds[2].Event.MessageID
		h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			if err := fx.handler()(ctx, tx, ev); err != nil {
				return err
			}
			if ev.MessageID == poison {
				return errors.New("poison")
			}
			return nil
		}
		res, err := s.ProcessBatch(ctx, db.Pool, ds, h)
		require.NoError(t, err)
		for i, r := range res {
			if i == 2 {
				require.Equal(t, inbox.HandlerFailed, r.Outcome)
				require.Equal(t, 1, r.Attempts)
				require.Equal(t, 0, fx.count(t, poison))
				continue
			}
			require.Equal(t, inbox.Processed, r.Outcome, "item %d", i)
			require.Equal(t, 1, fx.count(t, ds[i].Event.MessageID))
		}
		// Redeliver the batch: mates are duplicates, the poison runs again (below the ceiling).
		res, err = s.ProcessBatch(ctx, db.Pool, ds, h)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, res[0].Outcome)
		require.Equal(t, inbox.HandlerFailed, res[2].Outcome)
		require.Equal(t, 2, res[2].Attempts)
		for _, d := range ds {
			if d.Event.MessageID != poison {
				require.Equal(t, 1, fx.count(t, d.Event.MessageID))
			}
		}
	})

	t.Run("swallowed sql error falls back", func(t *testing.T) {
		var ds []inbox.Delivery
		for range 3 {
			ds = append(ds, inbox.Delivery{Event: newEvent("ordering", "t")})
		}
		bad := ds[1].Event.MessageID
		h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			if err := fx.handler()(ctx, tx, ev); err != nil {
				return err
			}
			if ev.MessageID == bad {
				_, _ = tx.Exec(ctx, `SELECT 1/0`)
			}
			return nil
		}
		res, err := s.ProcessBatch(ctx, db.Pool, ds, h)
		require.NoError(t, err)
		require.Equal(t, inbox.Processed, res[0].Outcome)
		require.Equal(t, inbox.HandlerFailed, res[1].Outcome)
		require.ErrorIs(t, res[1].Err, inbox.ErrTxAborted)
		require.Equal(t, inbox.Processed, res[2].Outcome)
		require.Equal(t, 0, fx.count(t, bad))
	})

	t.Run("unsatisfiable key", func(t *testing.T) {
		ev := newEvent("ordering", "t")
		ev.MessageID = ""
		_, err := s.ProcessBatch(ctx, db.Pool, []inbox.Delivery{{Event: newEvent("ordering", "t")}, {Event: ev}}, fx.handler())
		require.ErrorIs(t, err, inbox.ErrDedupePolicyUnsatisfied)
		require.ErrorContains(t, err, "delivery 1")
	})
}

func TestRetentionDeletesOnlyOldCompleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db)
	var ds []inbox.Delivery
	for range 7 {
		ds = append(ds, inbox.Delivery{Event: newEvent("ordering", "t")})
	}
	_, err := s.ProcessBatch(ctx, db.Pool, ds[:5], fx.handler())
	require.NoError(t, err)
	res, err := s.Process(ctx, db.Pool, ds[5], func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("x") })
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
	// Backdate four completed rows and the failed one by 40 days.
	_, err = db.Pool.Exec(ctx, `UPDATE `+db.Schema+`.keiro_inbox
		SET completed_at = now() - interval '40 days', failed_at = now() - interval '40 days', received_at = now() - interval '40 days'
		WHERE dedupe_key = ANY($1)`, []string{ds[0].Event.MessageID, ds[1].Event.MessageID, ds[2].Event.MessageID, ds[3].Event.MessageID, ds[5].Event.MessageID})
	require.NoError(t, err)
	// Another consumer's old row stays.
	other := newStore(t, db, func(c *inbox.StoreConfig) { c.Consumer = "other" })
	_, err = other.Process(ctx, db.Pool, ds[6], fx.handler())
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE `+db.Schema+`.keiro_inbox SET completed_at = now() - interval '40 days' WHERE consumer = 'other'`)
	require.NoError(t, err)

	n, err := s.DeleteCompleted(ctx, db.Pool, 30*24*time.Hour, 3)
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
	var left []string
	rows, err := db.Pool.Query(ctx, `SELECT consumer || '/' || status FROM `+db.Schema+`.keiro_inbox ORDER BY 1`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"billing/completed", "billing/failed", "other/completed"}, left)

	// After the window a redelivery is processed again (the documented trade-off).
	res, err = s.Process(ctx, db.Pool, ds[0], fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, 2, fx.count(t, ds[0].Event.MessageID))
}

func TestOperatorListRetryReprocess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.MaxAttempts = 1 })
	fail := func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("bad") }
	var keys []inbox.Key
	for i := range 3 {
		ev := newEvent(fmt.Sprintf("src%d", i%2), "t")
		res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev, Kafka: &inbox.KafkaRef{Topic: "t", Offset: int64(i)}}, fail)
		require.NoError(t, err)
		require.Equal(t, inbox.Poisoned, res.Outcome)
		keys = append(keys, inbox.Key{Source: ev.Source, DedupeKey: res.DedupeKey})
	}
	page1, err := inbox.NewAdmin(s).ListFailed(ctx, db.Pool, inbox.ListOptions{Limit: 2})
	require.NoError(t, err)
	require.Len(t, page1, 2)
	page2, err := inbox.NewAdmin(s).ListFailed(ctx, db.Pool, inbox.ListOptions{Limit: 2, After: &page1[1]})
	require.NoError(t, err)
	require.Len(t, page2, 1)
	require.True(t, page1[0].Poisoned)
	only0, err := inbox.NewAdmin(s).ListFailed(ctx, db.Pool, inbox.ListOptions{Source: "src0"})
	require.NoError(t, err)
	require.Len(t, only0, 2)

	_, err = inbox.NewAdmin(s).RetryFailed(ctx, db.Pool, inbox.RetryFilter{})
	require.Error(t, err)
	n, err := inbox.NewAdmin(s).RetryFailed(ctx, db.Pool, inbox.RetryFilter{Keys: keys[:1]})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	e, err := inbox.NewAdmin(s).Lookup(ctx, db.Pool, keys[0])
	require.NoError(t, err)
	require.False(t, e.Poisoned)
	require.Equal(t, 0, e.Attempts)

	// Reprocess runs the handler from the stored envelope, whatever the attempt count.
	var seen envelope.Event
	res, err := inbox.NewAdmin(s).Reprocess(ctx, db.Pool, keys[1], func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		seen = ev
		return fx.handler()(ctx, tx, ev)
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	require.Equal(t, keys[1].DedupeKey, seen.MessageID)
	require.NotEmpty(t, seen.Payload)
	require.NotNil(t, seen.Key)
	res, err = inbox.NewAdmin(s).Reprocess(ctx, db.Pool, keys[1], fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, res.Outcome)
	require.Equal(t, 1, fx.count(t, keys[1].DedupeKey))
	res, err = inbox.NewAdmin(s).Reprocess(ctx, db.Pool, keys[2], fail)
	require.NoError(t, err)
	require.Equal(t, inbox.Poisoned, res.Outcome)
	require.Equal(t, 2, res.Attempts)
	_, err = inbox.NewAdmin(s).Reprocess(ctx, db.Pool, inbox.Key{Source: "nope", DedupeKey: "nope"}, fail)
	require.ErrorIs(t, err, inbox.ErrNotFound)

	n, err = inbox.NewAdmin(s).RetryFailed(ctx, db.Pool, inbox.RetryFilter{All: true})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
}

func TestNewStoreValidation(t *testing.T) {
	t.Parallel()
	_, err := inbox.NewStore(inbox.StoreConfig{Schema: "Bad-Schema", MaxAttempts: -1, Persistence: 9})
	require.Error(t, err)
	for _, field := range []string{"Schema", "Consumer", "MaxAttempts", "Persistence"} {
		require.ErrorContains(t, err, field)
	}
}

// Two deliveries of a previously failed message race: the rerun is serialised on the failed
// row's lock, so the handler's effects commit once.
func TestConcurrentRerunOfFailedMessageRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db)
	ev := newEvent("ordering", "t")
	res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, func(context.Context, pgx.Tx, envelope.Event) error {
		return errors.New("first attempt fails")
	})
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)

	// Release the first handler once the second delivery waits on the failed row's lock.
	r1, r2, ran2 := raceDeliveries(t, db, fx, s, s, ev, `%`+db.Schema+`.keiro_inbox%FOR UPDATE%`)
	require.Equal(t, inbox.Processed, r1.Outcome)
	require.Equal(t, 1, r1.Attempts)
	require.Equal(t, inbox.Duplicate, r2.Outcome)
	require.Zero(t, ran2)
	require.Equal(t, 1, fx.count(t, ev.MessageID))
}

// raceDeliveries delivers ev twice at once: through first on db.Pool, whose handler blocks inside
// its transaction until another backend waits on a lock in a statement LIKE waitLike, and through
// second on a pool of its own (another process). Both calls must succeed; it returns their results and how many times the second
// delivery's handler ran.
func raceDeliveries(t *testing.T, db *testenv.DB, fx *effects, first, second *inbox.Store,
	ev envelope.Event, waitLike string) (r1, r2 inbox.Result, ran2 int64) {
	t.Helper()
	ctx := context.Background()
	pool2, err := pgxpool.New(ctx, db.ConnString)
	require.NoError(t, err)
	defer pool2.Close()
	entered := make(chan struct{})
	release := make(chan struct{})
	blocking := func(ctx context.Context, tx pgx.Tx, e envelope.Event) error {
		close(entered)
		<-release
		return fx.handler()(ctx, tx, e)
	}
	var ran atomic.Int64
	counting := func(ctx context.Context, tx pgx.Tx, e envelope.Event) error {
		ran.Add(1)
		return fx.handler()(ctx, tx, e)
	}
	var wg sync.WaitGroup
	var e1, e2 error
	wg.Go(func() { r1, e1 = first.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, blocking) })
	<-entered
	wg.Go(func() { r2, e2 = second.Process(ctx, pool2, inbox.Delivery{Event: ev}, counting) })
	require.Eventually(t, func() bool {
		var waiting int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE $1`, waitLike).Scan(&waiting)
		return waiting > 0
	}, 10*time.Second, 5*time.Millisecond)
	close(release)
	wg.Wait()
	require.NoError(t, e1)
	require.NoError(t, e2)
	return r1, r2, ran.Load()
}

// TestArchiveFailedRows: archived failed rows leave ListFailed, are listed with Archived, stay
// found by Lookup and run by Reprocess; completed and missing rows are not archived.
func TestArchiveFailedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.MaxAttempts = 1 })
	fail := func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("bad") }
	var keys []inbox.Key
	for range 2 {
		ev := newEvent("src", "t")
		res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, fail)
		require.NoError(t, err)
		keys = append(keys, inbox.Key{Source: ev.Source, DedupeKey: res.DedupeKey})
	}
	ok := newEvent("src", "t")
	res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ok}, fx.handler())
	require.NoError(t, err)
	done := inbox.Key{Source: ok.Source, DedupeKey: res.DedupeKey}

	_, err = inbox.NewAdmin(s).Archive(ctx, db.Pool, nil)
	require.Error(t, err)
	got, err := inbox.NewAdmin(s).Archive(ctx, db.Pool, []inbox.Key{keys[0], done, {Source: "src", DedupeKey: "missing"}})
	require.NoError(t, err)
	require.Equal(t, []inbox.Key{keys[0]}, got)
	got, err = inbox.NewAdmin(s).Archive(ctx, db.Pool, []inbox.Key{keys[0]})
	require.NoError(t, err)
	require.Empty(t, got, "archived already")

	working, err := inbox.NewAdmin(s).ListFailed(ctx, db.Pool, inbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, working, 1)
	require.Equal(t, keys[1].DedupeKey, working[0].DedupeKey)
	shelf, err := inbox.NewAdmin(s).ListFailed(ctx, db.Pool, inbox.ListOptions{Archived: true})
	require.NoError(t, err)
	require.Len(t, shelf, 1)
	require.Equal(t, keys[0].DedupeKey, shelf[0].DedupeKey)
	_, err = inbox.NewAdmin(s).Lookup(ctx, db.Pool, keys[0])
	require.NoError(t, err)
	r, err := inbox.NewAdmin(s).Reprocess(ctx, db.Pool, keys[0], fx.handler())
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, r.Outcome)
}

// TestAttemptHistory: every failed attempt, by a delivery or by Reprocess, joins the row's
// history with its number, time and error.
func TestAttemptHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.MaxAttempts = 5 })
	n := 0
	fail := func(context.Context, pgx.Tx, envelope.Event) error {
		n++
		return fmt.Errorf("downstream said no (%d)", n)
	}
	ev := newEvent("src", "t")
	for range 2 {
		res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, fail)
		require.NoError(t, err)
		require.Equal(t, inbox.HandlerFailed, res.Outcome)
	}
	k := inbox.Key{Source: ev.Source, DedupeKey: ev.MessageID}
	_, err := inbox.NewAdmin(s).Reprocess(ctx, db.Pool, k, fail)
	require.NoError(t, err)
	h, err := inbox.NewAdmin(s).AttemptHistory(ctx, db.Pool, k)
	require.NoError(t, err)
	require.Len(t, h, 3)
	for i, a := range h {
		require.Equal(t, i+1, a.Attempt)
		require.Equal(t, fmt.Sprintf("downstream said no (%d)", i+1), a.Error)
		require.False(t, a.At.IsZero())
	}
	_, err = inbox.NewAdmin(s).AttemptHistory(ctx, db.Pool, inbox.Key{Source: "src", DedupeKey: "none"})
	require.ErrorIs(t, err, inbox.ErrNotFound)
}
