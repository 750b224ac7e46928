package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// raise makes tx fail with SQLSTATE code, as PostgreSQL does on a deadlock (40P01), a
// serialization failure (40001) or a lock timeout (55P03).
func raise(ctx context.Context, tx pgx.Tx, code string) error {
	_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'contention' USING ERRCODE = '`+code+`'; END $$`)
	return err
}

// TestProcessContentionAndOutageUseNoAttempt: a handler failing on contention or with an
// Outage is Deferred: rolled back, no row and no attempt recorded (with MaxAttempts 1 a
// recorded attempt would poison the message), and the next delivery runs it. Marked
// Permanent, the same error poisons the message.
func TestProcessContentionAndOutageUseNoAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.MaxAttempts = 1 })
	failures := map[string]inbox.Handler{}
	for _, code := range []string{"40P01", "40001", "55P03"} {
		failures[code] = func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			if err := fx.handler()(ctx, tx, ev); err != nil {
				return err
			}
			return raise(ctx, tx, code)
		}
	}
	failures["outage"] = func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if err := fx.handler()(ctx, tx, ev); err != nil {
			return err
		}
		return inbox.OutageRetryAfter(errors.New("target unreachable"), time.Second)
	}
	for name, h := range failures {
		ev := newEvent("ordering", "billing.orders.v1")
		d := inbox.Delivery{Event: ev}
		res, err := s.Process(ctx, db.Pool, d, h)
		require.NoError(t, err, name)
		require.Equal(t, inbox.Deferred, res.Outcome, name)
		require.Error(t, res.Err, name)
		require.Zero(t, res.Attempts, name)
		_, err = inbox.NewAdmin(s).Lookup(ctx, db.Pool, inbox.Key{Source: "ordering", DedupeKey: ev.MessageID})
		require.ErrorIs(t, err, inbox.ErrNotFound, "%s: no failed row, no attempt", name)
		require.Zero(t, fx.count(t, ev.MessageID), "%s: effects rolled back", name)

		res, err = s.Process(ctx, db.Pool, d, fx.handler())
		require.NoError(t, err)
		require.Equal(t, inbox.Processed, res.Outcome, name)
		require.Equal(t, 1, fx.count(t, ev.MessageID), name)
	}
	ev := newEvent("ordering", "billing.orders.v1")
	res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, func(ctx context.Context, tx pgx.Tx, _ envelope.Event) error {
		return inbox.Permanent(raise(ctx, tx, "40P01"))
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Poisoned, res.Outcome)
	require.False(t, inbox.IsOutage(inbox.Permanent(inbox.Outage(errors.New("x")))), "Permanent wins")
}

// TestConsumerContentionIsNotPoison: under contention a good message survives more failures
// than MaxAttempts (they use no attempt), while a handler that always fails on contention still
// ends in the dead-letter topic once MaxContentionRetries are spent, after MaxAttempts ordinary
// failures. One record per transaction and the default group commit (where each record's first
// failure is inside the batch transaction, which is then re-run record by record).
func TestConsumerContentionIsNotPoison(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 0} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			testContentionIsNotPoison(t, batch)
		})
	}
}

func testContentionIsNotPoison(t *testing.T, batch int) {
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.contention.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	flaky, always, after := newEvent("ordering", topic), newEvent("ordering", topic), newEvent("ordering", topic)
	produceEvents(t, kc.NewClient(t), flaky, always, after)

	var mu sync.Mutex
	calls := map[string]int{}
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		mu.Lock()
		calls[ev.MessageID]++
		n := calls[ev.MessageID]
		mu.Unlock()
		switch {
		case ev.MessageID == flaky.MessageID && n <= 6:
			return raise(ctx, tx, "40001")
		case ev.MessageID == always.MessageID:
			return raise(ctx, tx, "40P01")
		}
		return fx.handler()(ctx, tx, ev)
	}
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: batch,
		MaxContentionRetries: 8,
		Store:                inbox.StoreConfig{Schema: db.Schema, MaxAttempts: 2}, OnCommitted: p.onCommitted,
	}, h)
	p.waitCommitted(t, topic, 3, 30*time.Second)
	r.stop(t)

	// In a batch, a record's first failure is the batch transaction's, re-run record by
	// record: one more call, one deferral fewer counted.
	inBatch := 0
	if batch != 1 {
		inBatch = 1
	}
	require.Equal(t, 1, fx.count(t, flaky.MessageID), "six contention failures with MaxAttempts 2: not poisoned")
	require.Equal(t, 1, fx.count(t, after.MessageID))
	mu.Lock()
	require.Equal(t, inBatch+8+2, calls[always.MessageID], "8 free contention retries, then 2 attempts")
	mu.Unlock()
	dlq := dlqRecords(t, kc, topic+".dlq", 1)
	require.Equal(t, inbox.ReasonPoisoned, header(dlq[always.MessageID], inbox.HeaderDLQReason))
	require.Equal(t, "2", header(dlq[always.MessageID], inbox.HeaderDLQAttempts))
	st := r.c.Stats()
	require.EqualValues(t, 1, st.DeadLettered)
	require.EqualValues(t, 6-inBatch+8, st.Deferred)
	e, err := inbox.NewAdmin(r.c.Store()).Lookup(context.Background(), db.Pool, inbox.Key{Source: "ordering", DedupeKey: flaky.MessageID})
	require.NoError(t, err)
	require.Zero(t, e.Attempts, "contention used no attempt")
}
