package events_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// poisonRig is a projection into a real table whose handler fails on events of type "Poison"
// while broken is set, and counts every delivery per event type.
type poisonRig struct {
	db         *testenv.DB
	store      *events.Store
	broken     atomic.Bool
	permanent  atomic.Bool
	mu         sync.Mutex
	deliveries map[string]int
}

func newPoisonRig(t *testing.T) *poisonRig {
	t.Helper()
	db := testenv.NewDB(t)
	r := &poisonRig{db: db, store: newStore(t, db), deliveries: map[string]int{}}
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %s.applied (position bigint PRIMARY KEY, type text NOT NULL)`, db.Schema))
	require.NoError(t, err)
	r.broken.Store(true)
	return r
}

func (r *poisonRig) handle(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
	r.mu.Lock()
	r.deliveries[e.Type]++
	r.mu.Unlock()
	if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.applied VALUES ($1, $2)`, r.db.Schema), e.GlobalPosition, e.Type); err != nil {
		return err
	}
	if e.Type == "Poison" && r.broken.Load() {
		err := errors.New("cannot apply Poison: unknown currency XXX")
		if r.permanent.Load() {
			return events.Permanent(err)
		}
		return err
	}
	return nil
}

func (r *poisonRig) count(typ string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deliveries[typ]
}

func (r *poisonRig) applied(t *testing.T) []string {
	t.Helper()
	rows, err := r.db.Pool.Query(context.Background(), fmt.Sprintf(`SELECT type FROM %s.applied ORDER BY position`, r.db.Schema))
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// seed appends Ok, Ok, Poison, Ok, Ok on one stream and returns the head.
func (r *poisonRig) seed(t *testing.T) int64 {
	t.Helper()
	for _, typ := range []string{"Ok", "Ok", "Poison", "Ok", "Ok"} {
		_, err := appendTx(t, r.db, r.store, "ledger-1", events.Any, ev(typ, `{}`))
		require.NoError(t, err)
	}
	return head(t, r.store, r.db)
}

// TestSubscriptionDeadLettersPoisonEvent: a handler that fails on one event gets it
// MaxDeliveries times, then the event is dead-lettered (class, text, attempts) and the events
// after it flow; after the handler is fixed, a requested replay applies it exactly once.
func TestSubscriptionDeadLettersPoisonEvent(t *testing.T) {
	t.Parallel()
	rig := newPoisonRig(t)
	ctx := context.Background()
	h := rig.seed(t)
	tm := newTelemetry()
	p := new(testenv.Progress)
	sub, err := events.NewSubscription(rig.store, rig.db.Pool, events.SubscriptionConfig{
		Name: "ledger", BatchSize: 2, AfterCommit: p.Set, MeterProvider: tm.mp,
		Retry: events.RetryPolicy{MaxDeliveries: 3, Backoff: keiro.Backoff{Initial: time.Millisecond}},
	}, rig.handle)
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	p.Wait(t, h, time.Minute, errc)

	require.Equal(t, 3, rig.count("Poison"), "MaxDeliveries deliveries, no more")
	require.Equal(t, []string{"Ok", "Ok", "Ok", "Ok"}, rig.applied(t), "later events flow; nothing applied twice")
	dead, err := rig.store.ListDeadLetters(ctx, rig.db.Pool, events.DeadLetterFilter{Subscription: "ledger"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	d := dead[0]
	require.Equal(t, "Poison", d.EventType)
	require.Equal(t, h-2, d.GlobalPosition)
	require.Equal(t, "ledger-1", d.StreamName)
	require.Equal(t, int64(3), d.StreamVersion)
	require.Equal(t, events.ErrorClassMaxDeliveries, d.ErrorClass)
	require.Contains(t, d.Error, "unknown currency XXX")
	require.Equal(t, 3, d.Attempts)
	require.Equal(t, events.DeadLetterDead, d.Status)
	require.Equal(t, int64(1), tm.counter(t, "keiro.subscription.deadlettered"))
	require.Equal(t, int64(2), tm.counter(t, "keiro.subscription.retried"))
	other, err := rig.store.ListDeadLetters(ctx, rig.db.Pool, events.DeadLetterFilter{Subscription: "other"})
	require.NoError(t, err)
	require.Empty(t, other)

	// A replay while still broken fails and leaves the row dead with one more attempt.
	p.Set(0)
	n, err := rig.store.RequestReplay(ctx, rig.db.Pool, "ledger")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	p.Wait(t, h, time.Minute, errc)
	dead, err = rig.store.ListDeadLetters(ctx, rig.db.Pool, events.DeadLetterFilter{Subscription: "ledger"})
	require.NoError(t, err)
	require.Equal(t, events.DeadLetterDead, dead[0].Status)
	require.Equal(t, 4, dead[0].Attempts)

	// Fixed: the replay applies it once, in the transaction that marks the row replayed.
	rig.broken.Store(false)
	p.Set(0)
	n, err = rig.store.RequestReplay(ctx, rig.db.Pool, "ledger", d.ID)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	p.Wait(t, h, time.Minute, errc)
	require.Equal(t, []string{"Ok", "Ok", "Poison", "Ok", "Ok"}, rig.applied(t))
	dead, err = rig.store.ListDeadLetters(ctx, rig.db.Pool, events.DeadLetterFilter{Subscription: "ledger", Status: events.DeadLetterReplayed})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.NotNil(t, dead[0].ReplayedAt)
	require.Equal(t, 5, dead[0].Attempts)
	// A replayed row is not requested again.
	n, err = rig.store.RequestReplay(ctx, rig.db.Pool, "ledger")
	require.NoError(t, err)
	require.Zero(t, n)
	pos, err := sub.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, h, pos)
}

// TestSubscriptionPermanentErrorAndBatchHandler: a Permanent error is dead-lettered on its
// first delivery, and a batch handler's failing batch is split to find the poison event.
func TestSubscriptionPermanentErrorAndBatchHandler(t *testing.T) {
	t.Parallel()
	rig := newPoisonRig(t)
	rig.permanent.Store(true)
	ctx := context.Background()
	h := rig.seed(t)
	p := new(testenv.Progress)
	sub, err := events.NewBatchSubscription(rig.store, rig.db.Pool, events.SubscriptionConfig{
		Name: "ledger", BatchSize: 10, AfterCommit: p.Set,
		Retry: events.RetryPolicy{MaxDeliveries: 3, Backoff: keiro.Backoff{Initial: time.Millisecond}},
	}, func(ctx context.Context, tx pgx.Tx, batch []events.RecordedEvent) error {
		for _, e := range batch {
			if err := rig.handle(ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	p.Wait(t, h, time.Minute, errc)
	// Once in the batch of five, once on its own: a permanent error is not retried.
	require.Equal(t, 2, rig.count("Poison"))
	require.Equal(t, []string{"Ok", "Ok", "Ok", "Ok"}, rig.applied(t))
	dead, err := rig.store.ListDeadLetters(ctx, rig.db.Pool, events.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, events.ErrorClassPermanent, dead[0].ErrorClass)
	require.Equal(t, 1, dead[0].Attempts)
}

// TestSubscriptionHaltPolicy: under PoisonHalt the event is delivered MaxDeliveries times,
// then Run returns the handler's error with the checkpoint before the event; nothing after it
// is applied and nothing is dead-lettered. The next Run delivers it first.
func TestSubscriptionHaltPolicy(t *testing.T) {
	t.Parallel()
	rig := newPoisonRig(t)
	ctx := context.Background()
	h := rig.seed(t)
	cfg := events.SubscriptionConfig{Name: "strict", BatchSize: 1,
		Retry: events.RetryPolicy{MaxDeliveries: 2, Backoff: keiro.Backoff{Initial: -1}, OnPoison: events.PoisonHalt}}
	sub, err := events.NewSubscription(rig.store, rig.db.Pool, cfg, rig.handle)
	require.NoError(t, err)
	err = sub.Run(ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), "unknown currency XXX")
	require.Contains(t, err.Error(), "halted")
	require.Equal(t, 2, rig.count("Poison"))
	require.Equal(t, []string{"Ok", "Ok"}, rig.applied(t))
	pos, err := sub.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, h-3, pos)
	dead, err := rig.store.ListDeadLetters(ctx, rig.db.Pool, events.DeadLetterFilter{})
	require.NoError(t, err)
	require.Empty(t, dead)

	rig.broken.Store(false)
	p := new(testenv.Progress)
	cfg.AfterCommit = p.Set
	sub, err = events.NewSubscription(rig.store, rig.db.Pool, cfg, rig.handle)
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	p.Wait(t, h, time.Minute, errc)
	require.Equal(t, []string{"Ok", "Ok", "Poison", "Ok", "Ok"}, rig.applied(t))
}

func TestRetryPolicyValidation(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	h := func(context.Context, pgx.Tx, events.RecordedEvent) error { return nil }
	_, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "x",
		Retry: events.RetryPolicy{MaxDeliveries: -1, Backoff: keiro.Backoff{Max: -time.Second}, OnPoison: 7}}, h)
	require.Error(t, err)
	for _, want := range []string{"Retry.MaxDeliveries", "Retry.Backoff.Max", "Retry.OnPoison"} {
		require.True(t, strings.Contains(err.Error(), want), err.Error())
	}
	_, err = s.ListDeadLetters(context.Background(), db.Pool, events.DeadLetterFilter{Status: "gone"})
	require.ErrorContains(t, err, "unknown status")
	_, err = s.RequestReplay(context.Background(), db.Pool, "")
	require.ErrorContains(t, err, "subscription name is required")
}

// TestSubscriptionDeadLettersUnstorableErrorText: a handler error holding a NUL byte and invalid
// UTF-8 (which a PostgreSQL text column refuses, SQLSTATE 22021) is stored with U+FFFD in their
// place, so the dead letter is recorded and the subscription moves past the event; a failed
// replay records such an error the same way.
func TestSubscriptionDeadLettersUnstorableErrorText(t *testing.T) {
	t.Parallel()
	rig := newPoisonRig(t)
	ctx := context.Background()
	h := rig.seed(t)
	var message atomic.Value
	message.Store("bad \x00 currency \xff")
	p := new(testenv.Progress)
	sub, err := events.NewSubscription(rig.store, rig.db.Pool, events.SubscriptionConfig{
		Name: "ledger", BatchSize: 10, AfterCommit: p.Set,
		Retry: events.RetryPolicy{MaxDeliveries: 2, Backoff: keiro.Backoff{Initial: time.Millisecond}},
	}, func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
		if e.Type == "Poison" {
			return events.Permanent(errors.New(message.Load().(string)))
		}
		return rig.handle(ctx, tx, e)
	})
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	p.Wait(t, h, time.Minute, errc)
	require.Equal(t, []string{"Ok", "Ok", "Ok", "Ok"}, rig.applied(t), "the events after the poisoned one flow")
	dead, err := rig.store.ListDeadLetters(ctx, rig.db.Pool, events.DeadLetterFilter{Subscription: "ledger"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.True(t, strings.HasSuffix(dead[0].Error, ": bad \uFFFD currency \uFFFD"), "%q", dead[0].Error)

	// The replay path stores its handler error the same way.
	message.Store("still bad \x00\xfe")
	p.Set(0)
	n, err := rig.store.RequestReplay(ctx, rig.db.Pool, "ledger")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	p.Wait(t, h, time.Minute, errc)
	dead, err = rig.store.ListDeadLetters(ctx, rig.db.Pool, events.DeadLetterFilter{Subscription: "ledger"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, events.DeadLetterDead, dead[0].Status)
	require.Equal(t, 2, dead[0].Attempts)
	require.True(t, strings.HasSuffix(dead[0].Error, ": still bad \uFFFD\uFFFD"), "%q", dead[0].Error)
}
