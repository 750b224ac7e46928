package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// pmIn is an input of the counter process manager.
type pmIn struct {
	Kind  string // "placed", "noop", "reject", "timeout"
	Order string
}

var pmFireAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// pmTimerID is the order's timeout timer: deterministic, so arming it twice is idempotent.
func pmTimerID(order string) envelope.UUID {
	return events.ProcessManagerCommandID("counter-pm", order, sampleSource, 1000)
}

// counterPM: "placed" records Added{1}, adds 1 to counter-target-<order> and arms a timeout;
// "noop" only arms the timeout; "reject" is refused; "timeout" records Added{10} and adds 5
// to the target, unless the state shows the order settled (Total ≥ 10).
func counterPMHandle(s counterState, in pmIn) (events.Reaction[counterEvent, counterCmd], error) {
	target := "counter-target-" + in.Order
	timer := events.TimerRequest{ID: pmTimerID(in.Order), FireAt: pmFireAt, Payload: json.RawMessage(`{"kind":"timeout"}`)}
	switch in.Kind {
	case "placed":
		return events.Reaction[counterEvent, counterCmd]{Events: []counterEvent{Added{1}},
			Commands: []events.Command[counterCmd]{{Stream: target, Command: counterCmd{N: 1}}},
			Timers:   []events.TimerRequest{timer}}, nil
	case "noop":
		return events.Reaction[counterEvent, counterCmd]{Timers: []events.TimerRequest{timer}}, nil
	case "timeout":
		if s.Total >= 10 {
			return events.Reaction[counterEvent, counterCmd]{}, nil
		}
		return events.Reaction[counterEvent, counterCmd]{Events: []counterEvent{Added{10}},
			Commands: []events.Command[counterCmd]{{Stream: target, Command: counterCmd{N: 5}}}}, nil
	}
	return events.Reaction[counterEvent, counterCmd]{}, errors.New("unknown input " + in.Kind)
}

func newCounterPM(t *testing.T, db *testenv.DB, tm *telemetry, target events.Target[counterCmd]) (*events.Store, *events.ProcessManager[counterState, pmIn, counterEvent, counterCmd]) {
	t.Helper()
	s, runner := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{})
	if target == nil {
		target = runner
	}
	pm, err := events.NewProcessManager(s, events.ProcessManagerConfig[counterState, pmIn, counterEvent, counterCmd]{
		Name:      "counter",
		Correlate: func(in pmIn) string { return in.Order },
		Handle:    counterPMHandle,
		Evolve:    counterDecider.Evolve,
		Codec:     counterCodec(t),
		Target:    target,
		Runner:    events.RunnerConfig[counterState]{SnapshotEvery: 2},
	})
	require.NoError(t, err)
	return s, pm
}

func TestProcessManagerReaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, pm := newCounterPM(t, db, nil, nil)
	ctx := context.Background()
	require.Equal(t, "pm:counter-order-1", pm.Stream("order-1"))

	res, err := pm.Dispatch(ctx, db.Pool, sampleSource, pmIn{"placed", "order-1"})
	require.NoError(t, err)
	require.NoError(t, res.Err())
	require.Equal(t, events.CommandAppended, res.Manager.Outcome)
	require.Equal(t, int64(1), res.Manager.Result.StreamVersion)
	require.Equal(t, []events.CommandOutcome{appended}, outcomes(res.Commands))
	require.Equal(t, 1, res.TimersScheduled)
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-target-order-1"))
	tmr, err := s.GetTimer(ctx, db.Pool, pmTimerID("order-1"))
	require.NoError(t, err)
	require.Equal(t, "counter", tmr.ProcessManager)
	require.Equal(t, "order-1", tmr.CorrelationID)
	require.Equal(t, events.TimerScheduled, tmr.Status)
	require.Equal(t, events.ProcessManagerCommandID("counter", "order-1", sampleSource, -1), res.Manager.CommandID)
	require.Equal(t, events.ProcessManagerCommandID("counter", "order-1", sampleSource, 0), res.Commands[0].CommandID)

	// A duplicate delivery: recognised, nothing written twice.
	res, err = pm.Dispatch(ctx, db.Pool, sampleSource, pmIn{"placed", "order-1"})
	require.NoError(t, err)
	require.Equal(t, events.CommandDuplicate, res.Manager.Outcome)
	require.Equal(t, []events.CommandOutcome{duplicate}, outcomes(res.Commands))
	require.Equal(t, 0, res.TimersScheduled)
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-target-order-1"))

	// A step without events still arms its timer.
	res, err = pm.Dispatch(ctx, db.Pool, envelope.NewUUIDv7(), pmIn{"noop", "order-2"})
	require.NoError(t, err)
	require.Equal(t, events.CommandAppended, res.Manager.Outcome)
	require.Equal(t, int64(0), res.Manager.Result.StreamVersion)
	require.Empty(t, res.Commands)
	require.Equal(t, 1, res.TimersScheduled)
	require.Equal(t, 0, streamLen(t, s, db, "pm:counter-order-2"))
	c, err := s.CountTimers(ctx, db.Pool, pmFireAt)
	require.NoError(t, err)
	require.Equal(t, int64(2), c.Due)

	_, err = events.NewProcessManager[counterState, pmIn, counterEvent, counterCmd](nil, events.ProcessManagerConfig[counterState, pmIn, counterEvent, counterCmd]{Name: "a-b"})
	for _, want := range []string{"store is nil", "Name:", "Correlate: required", "Handle: required", "Evolve: required", "Codec: required", "Target: required"} {
		require.ErrorContains(t, err, want)
	}
}

// TestProcessManagerCrashBetweenManagerAndTarget: the manager's step commits, the target's
// command does not (the process died, here a transient failure); redelivering the input
// recognises the step, recomputes its reaction on the state before it and dispatches the
// missing command only.
func TestProcessManagerCrashBetweenManagerAndTarget(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, inner := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	target := &scripted{inner: inner, fail: map[string]error{"counter-target-order-1": errors.New("connection lost")}}
	s, pm := newCounterPM(t, db, nil, target)
	ctx := context.Background()
	res, err := pm.Dispatch(ctx, db.Pool, sampleSource, pmIn{"placed", "order-1"})
	require.NoError(t, err)
	require.Equal(t, events.CommandAppended, res.Manager.Outcome)
	require.Equal(t, []events.CommandOutcome{failed}, outcomes(res.Commands))
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 0, streamLen(t, s, db, "counter-target-order-1"))

	target.fail = nil
	// Another step in between: the redelivery must decide on the state before its own step.
	_, err = pm.Dispatch(ctx, db.Pool, envelope.NewUUIDv7(), pmIn{"timeout", "order-1"})
	require.NoError(t, err)
	res, err = pm.Dispatch(ctx, db.Pool, sampleSource, pmIn{"placed", "order-1"})
	require.NoError(t, err)
	require.Equal(t, events.CommandDuplicate, res.Manager.Outcome)
	require.Equal(t, []events.CommandOutcome{appended}, outcomes(res.Commands))
	require.Equal(t, 2, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 2, streamLen(t, s, db, "counter-target-order-1")) // the timeout's and the healed one
	state, version, err := pm.Load(ctx, db.Pool, "order-1")
	require.NoError(t, err)
	require.Equal(t, int64(2), version)
	require.Equal(t, 11, state.Total)
}

// TestProcessManagerRejections: a rejected target under RejectedDeadLetter parks the command
// (emit 0) and keeps the manager's step; a rejected manager step parks emit -1 on the manager
// stream and writes nothing; the default halts.
func TestProcessManagerRejections(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, inner := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	target := &scripted{inner: inner, fail: map[string]error{"counter-target-order-1": &events.RejectedError{Stream: "counter-target-order-1", Err: errors.New("order closed")}}}
	s, pm := newCounterPM(t, db, nil, target)
	ctx := context.Background()
	decode := func(e events.RecordedEvent) (pmIn, error) {
		var in pmIn
		err := json.Unmarshal(e.Data, &in)
		return in, err
	}
	dl, err := pm.EventHandler(decode, events.DispatchPolicy{OnRejected: events.RejectedDeadLetter})
	require.NoError(t, err)
	halt, err := pm.EventHandler(decode, events.DispatchPolicy{})
	require.NoError(t, err)
	ev := func(id envelope.UUID, in pmIn) events.RecordedEvent {
		data, err := json.Marshal(in)
		require.NoError(t, err)
		return events.RecordedEvent{ID: id, GlobalPosition: 9, StreamName: "order-x", StreamVersion: 1, Type: "In", Data: data}
	}

	placed := ev(sampleSource, pmIn{"placed", "order-1"})
	require.ErrorIs(t, deliver(t, db, halt, placed), events.ErrDispatchHalted)
	require.Equal(t, 0, streamLen(t, s, db, "pm:counter-order-1"))
	require.NoError(t, deliver(t, db, dl, placed))
	require.NoError(t, deliver(t, db, dl, placed)) // redelivered: one dead letter still
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))

	rejected := ev(envelope.NewUUIDv7(), pmIn{"reject", "order-3"})
	require.NoError(t, deliver(t, db, dl, rejected))
	require.Equal(t, 0, streamLen(t, s, db, "pm:counter-order-3"))

	dls, err := s.ListDispatchDeadLetters(ctx, db.Pool, "counter", 0)
	require.NoError(t, err)
	require.Len(t, dls, 2)
	byIndex := map[int]events.DispatchDeadLetter{}
	for _, d := range dls {
		require.Equal(t, events.DispatcherProcessManager, d.Kind)
		require.Equal(t, events.ErrorClassCommandRejected, d.ErrorClass)
		byIndex[d.EmitIndex] = d
	}
	require.Equal(t, "counter-target-order-1", byIndex[0].TargetStream)
	require.Equal(t, "order-1", byIndex[0].CorrelationID)
	require.Equal(t, "pm:counter-order-3", byIndex[-1].TargetStream)
	require.Equal(t, rejected.ID, byIndex[-1].SourceEventID)
}

// TestProcessManagerTimerIsAnInput: a timer the manager armed fires through the TimerWorker
// as an input of the manager, in the fire's transaction, and is marked fired with the
// manager's event; a stale refire is a duplicate, so the effect happens once.
func TestProcessManagerTimerIsAnInput(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, pm := newCounterPM(t, db, nil, nil)
	ctx := context.Background()
	_, err := pm.Dispatch(ctx, db.Pool, sampleSource, pmIn{"placed", "order-1"})
	require.NoError(t, err)
	fire, err := pm.TimerFire(func(tm events.Timer) (pmIn, error) {
		var p struct{ Kind string }
		err := json.Unmarshal(tm.Payload, &p)
		return pmIn{Kind: p.Kind, Order: tm.CorrelationID}, err
	}, events.DispatchPolicy{})
	require.NoError(t, err)
	// The first fire's transaction fails after the step (a crash before commit): nothing of it
	// stays, and the timer is left firing until it is requeued.
	crashed := false
	w, err := events.NewTimerWorker(s, db.Pool, events.TimerWorkerConfig{Now: func() time.Time { return pmFireAt },
		Fire: func(ctx context.Context, tx pgx.Tx, tm events.Timer) (envelope.UUID, error) {
			id, err := fire(ctx, tx, tm)
			if err == nil && !crashed {
				crashed = true
				return id, errors.New("worker died before commit")
			}
			return id, err
		}})
	require.NoError(t, err)
	out, _, err := w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFireFailed, out)
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))
	ok, err := s.RequeueStuckTimer(ctx, db.Pool, pmTimerID("order-1"))
	require.NoError(t, err)
	require.True(t, ok)

	out, _, err = w.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, events.TimerFiredNow, out)
	tmr, err := s.GetTimer(ctx, db.Pool, pmTimerID("order-1"))
	require.NoError(t, err)
	require.Equal(t, events.TimerFired, tmr.Status)
	require.Equal(t, events.ProcessManagerCommandID("counter", "order-1", pmTimerID("order-1"), -1), *tmr.FiredEventID)
	require.Equal(t, 2, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 2, streamLen(t, s, db, "counter-target-order-1"))
	state, _, err := pm.Load(ctx, db.Pool, "order-1")
	require.NoError(t, err)
	require.Equal(t, 11, state.Total)

	// Another manager's timer is refused.
	_, err = fire(ctx, nil, events.Timer{ID: envelope.NewUUIDv7(), ProcessManager: "other"})
	require.ErrorContains(t, err, `belongs to process manager "other"`)
}

// TestProcessManagerFromInbox: from the inbox, the inbox row, the manager's event, its timer
// and its command commit together, or none of them does.
func TestProcessManagerFromInbox(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, pm := newCounterPM(t, db, nil, nil)
	ctx := context.Background()
	st, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "billing"})
	require.NoError(t, err)
	h, err := pm.InboxHandler(func(ev envelope.Event) (pmIn, error) {
		var in pmIn
		err := json.Unmarshal(ev.Payload, &in)
		return in, err
	}, events.DispatchPolicy{})
	require.NoError(t, err)
	msg := func(id, order string) envelope.Event {
		ev := integrationEvent(id, "")
		ev.Payload, _ = json.Marshal(pmIn{"placed", order})
		return ev
	}

	failing := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if err := h(ctx, tx, ev); err != nil {
			return err
		}
		return errors.New("the handler's next step failed")
	}
	res, err := st.Process(ctx, db.Pool, inbox.Delivery{Event: msg("m-1", "order-1")}, failing)
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
	require.Equal(t, 0, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 0, streamLen(t, s, db, "counter-target-order-1"))
	_, err = s.GetTimer(ctx, db.Pool, pmTimerID("order-1"))
	require.ErrorIs(t, err, events.ErrTimerNotFound)

	res, err = st.Process(ctx, db.Pool, inbox.Delivery{Event: msg("m-1", "order-1")}, h)
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome, "%v", res.Err)
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-target-order-1"))
	tmr, err := s.GetTimer(ctx, db.Pool, pmTimerID("order-1"))
	require.NoError(t, err)
	require.Equal(t, events.TimerScheduled, tmr.Status)

	// A step without events, in the inbox transaction, still arms its timer.
	noop := msg("m-2", "order-2")
	noop.Payload, _ = json.Marshal(pmIn{"noop", "order-2"})
	res, err = st.Process(ctx, db.Pool, inbox.Delivery{Event: noop}, h)
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome, "%v", res.Err)
	require.Equal(t, 0, streamLen(t, s, db, "pm:counter-order-2"))
	tmr, err = s.GetTimer(ctx, db.Pool, pmTimerID("order-2"))
	require.NoError(t, err)
	require.Equal(t, "order-2", tmr.CorrelationID)
}

// TestProcessManagerSnapshotsAndIsolation: manager streams take snapshots through the runner's
// policy (Every 2: the second step writes one at v2, the third lands at v3 from it); two
// managers with different names keep their instances apart.
func TestProcessManagerSnapshotsAndIsolation(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s, pm := newCounterPM(t, db, tm, nil)
	ctx := context.Background()
	for _, kind := range []string{"placed", "timeout"} {
		_, err := pm.Dispatch(ctx, db.Pool, envelope.NewUUIDv7(), pmIn{kind, "order-1"})
		require.NoError(t, err)
	}
	var v int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stream_version FROM keiro_snapshots WHERE stream_name = 'pm:counter-order-1'`).Scan(&v))
	require.Equal(t, int64(2), v)
	hits := tm.counter(t, "keiro.snapshot.read.hits")
	res, err := pm.Dispatch(ctx, db.Pool, envelope.NewUUIDv7(), pmIn{"placed", "order-1"})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Manager.Result.StreamVersion)
	require.Greater(t, tm.counter(t, "keiro.snapshot.read.hits"), hits)
	state, version, err := pm.Load(ctx, db.Pool, "order-1")
	require.NoError(t, err)
	require.Equal(t, int64(3), version)
	require.Equal(t, 12, state.Total)

	other, err := events.NewProcessManager(s, events.ProcessManagerConfig[counterState, pmIn, counterEvent, counterCmd]{
		Name: "billing", Correlate: func(in pmIn) string { return in.Order },
		Handle: counterPMHandle, Evolve: counterDecider.Evolve, Codec: counterCodec(t), Target: &scripted{inner: nopTarget{}},
	})
	require.NoError(t, err)
	res, err = other.Dispatch(ctx, db.Pool, sampleSource, pmIn{"placed", "order-1"})
	require.NoError(t, err)
	require.Equal(t, events.CommandAppended, res.Manager.Outcome) // not billing's duplicate of counter's step
	require.Equal(t, "pm:billing-order-1", res.Manager.Stream)
	require.Equal(t, 1, streamLen(t, s, db, "pm:billing-order-1"))
	require.Equal(t, 3, streamLen(t, s, db, "pm:counter-order-1"))
}

// nopTarget accepts every command and writes nothing.
type nopTarget struct{}

func (nopTarget) Run(context.Context, keiro.DB, string, counterCmd, ...events.RunOptions) (events.Result, error) {
	return events.Result{}, nil
}

// TestProcessManagerConcurrentDuplicateStep: another delivery records the same step between the
// lookup and the append; the step is recognised as that delivery's (a duplicate), and its
// command still goes out.
func TestProcessManagerConcurrentDuplicateStep(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, pm := newCounterPM(t, db, nil, nil)
	ctx := context.Background()
	id := events.ProcessManagerCommandID("counter", "order-1", sampleSource, -1)
	events.SetProcessManagerBeforeAppend(pm, func(ctx context.Context, stream string, attempt int) {
		if attempt != 1 {
			return
		}
		_, err := appendTx(t, db, s, stream, events.Any, events.EventData{ID: id, Type: "Added", SchemaVersion: 1, Data: []byte(`{"n":1}`)})
		require.NoError(t, err)
	})
	res, err := pm.Dispatch(ctx, db.Pool, sampleSource, pmIn{"placed", "order-1"})
	require.NoError(t, err)
	require.Equal(t, events.CommandDuplicate, res.Manager.Outcome)
	require.Equal(t, id, res.Manager.CommandID)
	require.Equal(t, []events.CommandOutcome{appended}, outcomes(res.Commands))
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-target-order-1"))
}

// TestProcessManagerFromSubscriptionAndDeadLetterReplay: a process manager run by a
// subscription; an input whose command keeps failing transiently is dead-lettered by the
// subscription (nothing of it committed), and once the cause is fixed an operator's replay
// delivers it again: the step and its command commit once.
func TestProcessManagerFromSubscriptionAndDeadLetterReplay(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, inner := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	target := &scripted{inner: inner, fail: map[string]error{"counter-target-order-2": &events.RetryExhaustedError{
		Stream: "counter-target-order-2", Attempts: 4, Last: &events.WrongExpectedVersionError{Stream: "counter-target-order-2"}}}}
	s, pm := newCounterPM(t, db, nil, target)
	ctx := context.Background()
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		data, err := json.Marshal(pmIn{"placed", order})
		require.NoError(t, err)
		_, err = appendTx(t, db, s, events.StreamName("input", order), events.NoStream, events.EventData{Type: "In", SchemaVersion: 1, Data: data})
		require.NoError(t, err)
	}
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
	var last events.RecordedEvent
	for e, err := range s.ReadStream(ctx, db.Pool, "input-order-3", events.Forward, 0) {
		require.NoError(t, err)
		last = e
	}
	p.Wait(t, last.GlobalPosition, time.Minute, errc)
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-1"))
	require.Equal(t, 0, streamLen(t, s, db, "pm:counter-order-2")) // rolled back with its failed command
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-3"))
	dead, err := s.ListDeadLetters(ctx, db.Pool, events.DeadLetterFilter{Subscription: "saga"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "input-order-2", dead[0].StreamName)

	target.fail = nil
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
	require.Equal(t, 1, streamLen(t, s, db, "pm:counter-order-2"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-target-order-2"))
}
