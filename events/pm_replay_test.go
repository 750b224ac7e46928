package events_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestProcessManager_ReplayOfAnAlreadyProcessedDeadLetter is keiro's "Keiro.ProcessManager":
// "reports an already-processed Kiroku dead letter without appending". An input the
// subscription dead-lettered is then handled by another path (here the manager's handler called
// directly, as an inbox or a manual run would); the operator's replay of the dead letter
// delivers it again, the manager recognises its step, and nothing is appended twice.
func TestProcessManager_ReplayOfAnAlreadyProcessedDeadLetter(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, inner := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	target := &scripted{inner: inner, fail: map[string]error{"counter-target-order-1": &events.RetryExhaustedError{
		Stream: "counter-target-order-1", Attempts: 4, Last: &events.WrongExpectedVersionError{Stream: "counter-target-order-1"}}}}
	s, pm := newCounterPM(t, db, nil, target)
	ctx := context.Background()
	data, err := json.Marshal(pmIn{"placed", "order-1"})
	require.NoError(t, err)
	input, err := appendTx(t, db, s, events.StreamName("input", "order-1"), events.NoStream, events.EventData{Type: "In", SchemaVersion: 1, Data: data})
	require.NoError(t, err)
	h, err := pm.EventHandler(func(e events.RecordedEvent) (pmIn, error) {
		var in pmIn
		err := json.Unmarshal(e.Data, &in)
		return in, err
	}, events.DispatchPolicy{})
	require.NoError(t, err)
	p := new(testenv.Progress)
	sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "saga", Category: "input", AfterCommit: p.Set,
		Retry: events.RetryPolicy{MaxDeliveries: 2, Backoff: keiro.Backoff{Initial: -1}}}, h)
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	p.Wait(t, input.GlobalPosition, time.Minute, errc)
	dead, err := s.ListDeadLetters(ctx, db.Pool, events.DeadLetterFilter{Subscription: "saga"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Zero(t, streamLen(t, s, db, "pm:counter-order-1"))

	// The cause is fixed and the input handled by another path: step and command commit.
	target.fail = nil
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return h(ctx, tx, input.Events[0]) }))
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-target-order-1"))

	// The replay of the dead letter is a duplicate: it is marked replayed, nothing is appended.
	changed := p.Changed()
	n, err := s.RequestReplay(ctx, db.Pool, "saga")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	for {
		dead, err = s.ListDeadLetters(ctx, db.Pool, events.DeadLetterFilter{Subscription: "saga", Status: events.DeadLetterReplayed})
		require.NoError(t, err)
		if len(dead) == 1 {
			break
		}
		select {
		case <-changed: // AfterCommit runs after each replay
			changed = p.Changed()
		case err := <-errc:
			t.Fatalf("subscription stopped: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("the replay did not happen")
		}
	}
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-target-order-1"))
}
