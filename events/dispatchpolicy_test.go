package events_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// routedInput is an input whose commands are listed in the input itself.
type routedInput struct {
	Group   string
	Targets []events.Command[counterCmd]
	Fail    error // Resolve's error
}

func newListRouter(t *testing.T, db *testenv.DB, tm *telemetry) (*events.Store, *events.Router[routedInput, counterCmd]) {
	t.Helper()
	s, target := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{})
	r, err := events.NewRouter(s, events.RouterConfig[routedInput, counterCmd]{
		Name: "lister",
		Key:  func(in routedInput) string { return in.Group },
		Resolve: func(_ context.Context, in routedInput) ([]events.Command[counterCmd], error) {
			return in.Targets, in.Fail
		},
		Target: target,
	})
	require.NoError(t, err)
	return s, r
}

// recorded is a source event carrying a routedInput; decode fails on data "poison".
func recordedInput(id envelope.UUID, pos int64, data string) events.RecordedEvent {
	return events.RecordedEvent{ID: id, GlobalPosition: pos, StreamName: "order-1", StreamVersion: 1, Type: "Placed", Data: []byte(data)}
}

func decodeRouted(in routedInput) func(events.RecordedEvent) (routedInput, error) {
	return func(e events.RecordedEvent) (routedInput, error) {
		if string(e.Data) == "poison" {
			return routedInput{}, errors.New("undecodable payload")
		}
		return in, nil
	}
}

// deliver runs h for e in one transaction, as a subscription does: committed when h succeeds.
func deliver(t *testing.T, db *testenv.DB, h events.Handler, e events.RecordedEvent) error {
	t.Helper()
	return pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error { return h(context.Background(), tx, e) })
}

var (
	rejecting = events.Command[counterCmd]{Stream: "counter-rejects", Command: counterCmd{N: -1}}
	accepting = events.Command[counterCmd]{Stream: "counter-ok", Command: counterCmd{N: 1}}
)

func TestDispatchRejectedHaltsByDefault(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s, r := newListRouter(t, db, tm)
	in := routedInput{Group: "g1", Targets: []events.Command[counterCmd]{accepting, rejecting}}
	h, err := r.EventHandler(decodeRouted(in), events.DispatchPolicy{})
	require.NoError(t, err)
	err = deliver(t, db, h, recordedInput(sampleSource, 7, "{}"))
	require.ErrorIs(t, err, events.ErrDispatchHalted)
	require.ErrorIs(t, err, events.ErrCommandRejected)
	require.ErrorContains(t, err, "negative amount")
	// Nothing of the input committed: the accepted command rolled back with it.
	require.Equal(t, 0, streamLen(t, s, db, "counter-ok"))
	require.Equal(t, int64(1), tm.counter(t, "keiro.dispatch.failed"))
}

func TestDispatchRejectedDeadLetterIsIdempotent(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s, r := newListRouter(t, db, tm)
	ctx := context.Background()
	in := routedInput{Group: "g1", Targets: []events.Command[counterCmd]{rejecting, accepting}}
	h, err := r.EventHandler(decodeRouted(in), events.DispatchPolicy{OnRejected: events.RejectedDeadLetter})
	require.NoError(t, err)
	require.NoError(t, deliver(t, db, h, recordedInput(sampleSource, 7, "{}")))
	require.Equal(t, 1, streamLen(t, s, db, "counter-ok"))

	dls, err := s.ListDispatchDeadLetters(ctx, db.Pool, "lister", 0)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	d := dls[0]
	require.Equal(t, events.DispatcherRouter, d.Kind)
	require.Equal(t, "g1", d.CorrelationID)
	require.Equal(t, sampleSource, d.SourceEventID)
	require.Equal(t, int64(7), d.SourceGlobalPosition)
	require.Equal(t, 0, d.EmitIndex)
	require.Equal(t, "counter-rejects", d.TargetStream)
	require.Equal(t, events.RouterCommandID("lister", "g1", sampleSource, "counter-rejects", 0), d.CommandID)
	require.Equal(t, events.ErrorClassCommandRejected, d.ErrorClass)
	require.Contains(t, d.Error, "negative amount")

	// A redelivery records nothing new and dispatches nothing twice.
	require.NoError(t, deliver(t, db, h, recordedInput(sampleSource, 7, "{}")))
	dls, err = s.ListDispatchDeadLetters(ctx, db.Pool, "", 0)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, 1, streamLen(t, s, db, "counter-ok"))
	require.Equal(t, int64(2), tm.counter(t, "keiro.dispatch.deadlettered"))
	require.Equal(t, int64(1), tm.counter(t, "keiro.dispatch.duplicates"))

	none, err := s.ListDispatchDeadLetters(ctx, db.Pool, "another", 0)
	require.NoError(t, err)
	require.Empty(t, none)
	_, err = s.ListDispatchDeadLetters(ctx, db.Pool, "", -1)
	require.ErrorContains(t, err, "negative")
}

func TestDispatchDeadLetterDetailIsBounded(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, target := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	long := strings.Repeat("x", 1100)
	r, err := events.NewRouter(s, events.RouterConfig[routedInput, counterCmd]{
		Name: "long", Key: func(routedInput) string { return "k" },
		Resolve: func(context.Context, routedInput) ([]events.Command[counterCmd], error) {
			return []events.Command[counterCmd]{rejecting}, nil
		},
		Target: &scripted{inner: target, fail: map[string]error{"counter-rejects": &events.RejectedError{Stream: "counter-rejects", Err: errors.New(long)}}},
	})
	require.NoError(t, err)
	h, err := r.EventHandler(decodeRouted(routedInput{}), events.DispatchPolicy{OnRejected: events.RejectedDeadLetter})
	require.NoError(t, err)
	require.NoError(t, deliver(t, db, h, recordedInput(sampleSource, 1, "{}")))
	dls, err := s.ListDispatchDeadLetters(context.Background(), db.Pool, "long", 0)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Len(t, dls[0].Error, 1024)
}

// scripted is a target that fails the commands to the streams in fail with their error and
// runs the others on inner.
type scripted struct {
	inner events.Target[counterCmd]
	fail  map[string]error
}

func (r *scripted) Run(ctx context.Context, db keiro.DB, stream string, cmd counterCmd, opts ...events.RunOptions) (events.Result, error) {
	if err := r.fail[stream]; err != nil {
		return events.Result{}, err
	}
	return r.inner.Run(ctx, db, stream, cmd, opts...)
}

func TestDispatchRejectedSkip(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s, r := newListRouter(t, db, tm)
	in := routedInput{Group: "g1", Targets: []events.Command[counterCmd]{rejecting, accepting}}
	h, err := r.EventHandler(decodeRouted(in), events.DispatchPolicy{OnRejected: events.RejectedSkip})
	require.NoError(t, err)
	require.NoError(t, deliver(t, db, h, recordedInput(sampleSource, 7, "{}")))
	require.Equal(t, 1, streamLen(t, s, db, "counter-ok"))
	dls, err := s.ListDispatchDeadLetters(context.Background(), db.Pool, "", 0)
	require.NoError(t, err)
	require.Empty(t, dls)
	require.Equal(t, int64(1), tm.counter(t, "keiro.dispatch.deadlettered"))
}

func TestDispatchPoisonInput(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	_, r := newListRouter(t, db, tm)
	poison := recordedInput(sampleSource, 3, "poison")

	h, err := r.EventHandler(decodeRouted(routedInput{}), events.DispatchPolicy{})
	require.NoError(t, err)
	err = deliver(t, db, h, poison)
	require.ErrorIs(t, err, events.ErrDispatchHalted)
	require.ErrorContains(t, err, "undecodable payload")
	require.False(t, events.IsPermanent(err))

	var skipped []events.DispatchSource
	onSkip := func(_ context.Context, src events.DispatchSource, err error) {
		require.ErrorContains(t, err, "undecodable payload")
		skipped = append(skipped, src)
	}
	h, err = r.EventHandler(decodeRouted(routedInput{}), events.DispatchPolicy{OnPoison: events.InputSkip, OnSkip: onSkip})
	require.NoError(t, err)
	require.NoError(t, deliver(t, db, h, poison))
	require.Equal(t, []events.DispatchSource{{EventID: sampleSource, GlobalPosition: 3}}, skipped)

	h, err = r.EventHandler(decodeRouted(routedInput{}), events.DispatchPolicy{OnPoison: events.InputDeadLetter, OnSkip: onSkip})
	require.NoError(t, err)
	err = deliver(t, db, h, poison)
	require.True(t, events.IsPermanent(err), "%v", err)
	require.NotErrorIs(t, err, events.ErrDispatchHalted)
	require.Len(t, skipped, 2)
	require.Equal(t, int64(3), tm.counter(t, "keiro.dispatch.poison"))

	_, err = r.EventHandler(nil, events.DispatchPolicy{})
	require.ErrorContains(t, err, "decode is nil")
	_, err = r.EventHandler(decodeRouted(routedInput{}), events.DispatchPolicy{OnPoison: 9, OnRejected: 9})
	require.ErrorContains(t, err, "OnPoison: unknown policy 9")
	require.ErrorContains(t, err, "OnRejected: unknown policy 9")
}

func TestDispatchTransientAndSystemicFailures(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, r := newListRouter(t, db, nil)
	e := recordedInput(sampleSource, 1, "{}")
	handler := func(in routedInput) events.Handler {
		h, err := r.EventHandler(decodeRouted(in), events.DispatchPolicy{OnRejected: events.RejectedDeadLetter})
		require.NoError(t, err)
		return h
	}

	// A resolver that lost its connection: delivered again, neither halted nor permanent.
	lost := &pgconn.PgError{Code: "08006", Message: "connection failure"}
	err := deliver(t, db, handler(routedInput{Group: "g1", Fail: lost}), e)
	require.ErrorIs(t, err, lost)
	require.NotErrorIs(t, err, events.ErrDispatchHalted)
	require.False(t, events.IsPermanent(err))

	// A resolver that fails deterministically halts.
	err = deliver(t, db, handler(routedInput{Group: "g1", Fail: errors.New("no such group")}), e)
	require.ErrorIs(t, err, events.ErrDispatchHalted)

	// A version conflict that outlived the runner's retries is transient; it rolls back the
	// input's other commands, which the redelivery dispatches with the rest.
	conflict := events.Command[counterCmd]{Stream: "counter-conflict", Command: counterCmd{N: 1}}
	_, inner := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	flaky := &scripted{inner: inner, fail: map[string]error{"counter-conflict": &events.RetryExhaustedError{
		Stream: "counter-conflict", Attempts: 4, Last: &events.WrongExpectedVersionError{Stream: "counter-conflict"}}}}
	fr, err := events.NewRouter(s, events.RouterConfig[routedInput, counterCmd]{
		Name: "flaky", Key: func(in routedInput) string { return in.Group },
		Resolve: func(_ context.Context, in routedInput) ([]events.Command[counterCmd], error) { return in.Targets, nil },
		Target:  flaky,
	})
	require.NoError(t, err)
	fh, err := fr.EventHandler(decodeRouted(routedInput{Group: "g1", Targets: []events.Command[counterCmd]{accepting, conflict}}),
		events.DispatchPolicy{OnRejected: events.RejectedDeadLetter})
	require.NoError(t, err)
	err = deliver(t, db, fh, e)
	require.ErrorIs(t, err, events.ErrRetryExhausted)
	require.NotErrorIs(t, err, events.ErrDispatchHalted)
	require.False(t, events.IsPermanent(err))
	require.Equal(t, 0, streamLen(t, s, db, "counter-ok"))
	flaky.fail = nil
	require.NoError(t, deliver(t, db, fh, e))
	require.Equal(t, 1, streamLen(t, s, db, "counter-ok"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-conflict"))

	// A target that is no stream name is systemic: it halts, even under RejectedDeadLetter.
	bad := events.Command[counterCmd]{Stream: "no_category", Command: counterCmd{N: 1}}
	err = deliver(t, db, handler(routedInput{Group: "g2", Targets: []events.Command[counterCmd]{accepting, bad}}),
		recordedInput(envelope.NewUUIDv7(), 2, "{}"))
	require.ErrorIs(t, err, events.ErrDispatchHalted)
	require.ErrorIs(t, err, events.ErrInvalidStreamName)
	dls, err := s.ListDispatchDeadLetters(context.Background(), db.Pool, "", 0)
	require.NoError(t, err)
	require.Empty(t, dls)
}

// abortingTarget fails its commands with an SQL error, which aborts the transaction it ran in,
// and reports it as a rejection.
type abortingTarget struct{ inner events.Target[counterCmd] }

func (a abortingTarget) Run(ctx context.Context, db keiro.DB, stream string, cmd counterCmd, opts ...events.RunOptions) (events.Result, error) {
	if stream != "counter-aborts" {
		return a.inner.Run(ctx, db, stream, cmd, opts...)
	}
	_, err := db.Exec(ctx, `SELECT 1/0`)
	return events.Result{}, &events.RejectedError{Stream: stream, Err: err}
}

// TestDispatchInTransactionSurvivesAnAbortedCommand: a command that aborted the input's
// transaction is rolled back to its savepoint; the commands after it, and its dead letter,
// commit with the input.
func TestDispatchInTransactionSurvivesAnAbortedCommand(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, target := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	r, err := events.NewRouter(s, events.RouterConfig[routedInput, counterCmd]{
		Name: "aborting", Key: func(in routedInput) string { return in.Group },
		Resolve: func(_ context.Context, in routedInput) ([]events.Command[counterCmd], error) { return in.Targets, nil },
		Target:  abortingTarget{target},
	})
	require.NoError(t, err)
	in := routedInput{Group: "g1", Targets: []events.Command[counterCmd]{
		{Stream: "counter-before", Command: counterCmd{N: 1}},
		{Stream: "counter-aborts", Command: counterCmd{N: 1}},
		{Stream: "counter-after", Command: counterCmd{N: 1}},
	}}
	h, err := r.EventHandler(decodeRouted(in), events.DispatchPolicy{OnRejected: events.RejectedDeadLetter})
	require.NoError(t, err)
	require.NoError(t, deliver(t, db, h, recordedInput(sampleSource, 1, "{}")))
	require.Equal(t, 1, streamLen(t, s, db, "counter-before"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-after"))
	dls, err := s.ListDispatchDeadLetters(context.Background(), db.Pool, "aborting", 0)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "counter-aborts", dls[0].TargetStream)
	require.Contains(t, dls[0].Error, "division by zero")
}
