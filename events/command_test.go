package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The counter aggregate used by the runner tests.

type counterEvent interface{ isCounterEvent() }

type Added struct {
	N int `json:"n"`
}

type Reset struct{}

func (Added) isCounterEvent() {}
func (Reset) isCounterEvent() {}

type counterState struct {
	Total  int `json:"total"`
	Events int `json:"events"`
}

// counterCmd adds N (N = 0 is a no-op; N < 0 is rejected; Twice emits two events).
type counterCmd struct {
	N     int
	Twice bool
}

var counterDecider = events.Decider[counterState, counterCmd, counterEvent]{
	Decide: func(s counterState, c counterCmd) ([]counterEvent, error) {
		switch {
		case c.N < 0:
			return nil, errors.New("negative amount")
		case c.N == 0:
			return nil, nil
		case c.Twice:
			return []counterEvent{Added{c.N}, Added{c.N}}, nil
		}
		return []counterEvent{Added{c.N}}, nil
	},
	Evolve: func(s counterState, e counterEvent) counterState {
		switch e := e.(type) {
		case Added:
			s.Total += e.N
		case Reset:
			s.Total = 0
		}
		s.Events++
		return s
	},
}

func counterCodec(t testing.TB) *events.JSONCodec[counterEvent] {
	c := events.NewJSONCodec[counterEvent]()
	require.NoError(t, events.RegisterJSON[Added](c, "Added", 1))
	require.NoError(t, events.RegisterJSON[Reset](c, "Reset", 1))
	return c
}

type telemetry struct {
	metrics *sdkmetric.ManualReader
	spans   *tracetest.SpanRecorder
	mp      *sdkmetric.MeterProvider
	tp      *sdktrace.TracerProvider
}

func newTelemetry() *telemetry {
	t := &telemetry{metrics: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(t.metrics))
	t.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(t.spans))
	return t
}

// counter returns the sum of a counter instrument's data points (0 if never recorded).
func (tm *telemetry) counter(t testing.TB, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tm.metrics.Collect(context.Background(), &rm))
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					total += p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					total += p.Value
				}
			}
		}
	}
	return total
}

func newCounterRunner(t testing.TB, db *testenv.DB, tm *telemetry, cfg events.RunnerConfig[counterState]) (*events.Store, *events.Runner[counterState, counterCmd, counterEvent]) {
	t.Helper()
	sc := events.StoreConfig{Schema: db.Schema}
	if tm != nil {
		sc.MeterProvider, sc.TracerProvider = tm.mp, tm.tp
		cfg.TracerProvider = tm.tp
	}
	s, err := events.NewStore(sc)
	require.NoError(t, err)
	r, err := events.NewRunner(s, counterDecider, counterCodec(t), cfg)
	require.NoError(t, err)
	return s, r
}

func TestRunBasics(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{})
	ctx := context.Background()

	res, err := r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 2})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.StreamVersion)
	require.Len(t, res.Events, 1)
	require.NotZero(t, res.GlobalPosition)
	require.Equal(t, 1, res.Attempts)
	require.Equal(t, "Added", res.Events[0].Type)
	require.JSONEq(t, `{"n":2}`, string(res.Events[0].Data))

	noop, err := r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 0})
	require.NoError(t, err)
	require.Equal(t, int64(1), noop.StreamVersion)
	require.Zero(t, noop.GlobalPosition)
	require.Empty(t, noop.Events)

	res, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 3, Twice: true})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.StreamVersion)
	require.Len(t, res.Events, 2)
	state, version, err := r.Load(ctx, db.Pool, "counter-1")
	require.NoError(t, err)
	require.Equal(t, int64(3), version)
	require.Equal(t, counterState{Total: 8, Events: 3}, state)

	_, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: -1})
	require.ErrorContains(t, err, "negative amount")
	_, err = r.Run(ctx, db.Pool, "counter", counterCmd{N: 1})
	require.ErrorIs(t, err, events.ErrInvalidStreamName)

	// The command span: name = stream, keiro attributes.
	var found bool
	for _, sp := range tm.spans.Ended() {
		if sp.Name() != "counter-1" {
			continue
		}
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range sp.Attributes() {
			attrs[kv.Key] = kv.Value
		}
		if attrs["keiro.events.appended"].AsInt64() == 2 {
			found = true
			require.Equal(t, "counter-1", attrs["keiro.stream.name"].AsString())
			require.Equal(t, "postgresql", attrs["db.system.name"].AsString())
			require.Equal(t, int64(1), attrs["keiro.retry.attempt"].AsInt64())
		}
	}
	require.True(t, found, "command span with keiro.events.appended=2")

	// Stored events carry the command span's trace context.
	stored := collect(t, s.ReadStream(ctx, db.Pool, "counter-1", events.Forward, 0))
	require.NotNil(t, stored[0].Metadata.TraceContext)

	// An unknown stored type fails hydration with the known tags.
	_, err = appendTx(t, db, s, "counter-1", events.Any, ev("OtherEvent", `{}`))
	require.NoError(t, err)
	_, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 1})
	require.ErrorIs(t, err, events.ErrUnknownEventType)
	require.ErrorContains(t, err, `[Added Reset]`)
}

func TestRunRetriesConflicts(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{RetryLimit: 2, Backoff: keiro.Backoff{Initial: -1}})
	ctx := context.Background()
	_, err := r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 1})
	require.NoError(t, err)

	// A writer slips in once before the append: the runner rehydrates and succeeds.
	interfere := func(times int) func(context.Context, string, int) {
		return func(ctx context.Context, stream string, attempt int) {
			if attempt <= times {
				_, err := appendTx(t, db, s, stream, events.Any, ev("Added", `{"n":10}`))
				require.NoError(t, err)
			}
		}
	}
	events.SetBeforeAppend(r, interfere(1))
	res, err := r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 2})
	require.NoError(t, err)
	require.Equal(t, 2, res.Attempts)
	require.Equal(t, int64(3), res.StreamVersion)
	state, _, err := r.Load(ctx, db.Pool, "counter-1")
	require.NoError(t, err)
	require.Equal(t, 13, state.Total)
	require.Equal(t, int64(1), tm.counter(t, "keiro.command.conflicts"))
	require.Equal(t, int64(1), tm.counter(t, "keiro.command.retries"))

	// A conflict on every attempt exhausts the budget: 3 attempts, 3 conflicts, 2 retries.
	events.SetBeforeAppend(r, interfere(100))
	res, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 2})
	require.ErrorIs(t, err, events.ErrRetryExhausted)
	require.ErrorIs(t, err, events.ErrWrongExpectedVersion)
	var rex *events.RetryExhaustedError
	require.True(t, errors.As(err, &rex))
	require.Equal(t, 3, rex.Attempts)
	require.Equal(t, int64(1+3), tm.counter(t, "keiro.command.conflicts"))
	require.Equal(t, int64(1+2), tm.counter(t, "keiro.command.retries"))
}

func TestRunAssumeNew(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{})
	ctx := context.Background()
	guess := events.RunOptions{AssumeNew: true}
	res, err := r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 2}, guess)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.StreamVersion)
	require.Equal(t, 1, res.Attempts)

	// The stream exists: the guess conflicts, the runner hydrates and decides on the real state.
	res, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 3}, guess)
	require.NoError(t, err)
	require.Equal(t, int64(2), res.StreamVersion)
	require.Equal(t, 1, res.Attempts)
	require.Zero(t, tm.counter(t, "keiro.command.conflicts"))
	require.Zero(t, tm.counter(t, "keiro.command.retries"))
	state, _, err := r.Load(ctx, db.Pool, "counter-1")
	require.NoError(t, err)
	require.Equal(t, counterState{Total: 5, Events: 2}, state)

	// A no-op or rejection on the guessed state is re-decided on the real one.
	noop, err := r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 0}, guess)
	require.NoError(t, err)
	require.Equal(t, int64(2), noop.StreamVersion)
	_, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: -1}, guess)
	require.ErrorContains(t, err, "negative amount")
	require.Len(t, collect(t, s.ReadStream(ctx, db.Pool, "counter-1", events.Forward, 0)), 2)
}

// TestConcurrentCommandsOneStream: 8 goroutines on one stream; every command is applied exactly
// once or reported as conflicted, and versions stay contiguous.
func TestConcurrentCommandsOneStream(t *testing.T) {
	t.Parallel()
	// With a generous budget every command lands by retry; with none, many are reported as
	// conflicted — and those must not be stored.
	for _, limit := range []int{20, -1} {
		t.Run(fmt.Sprintf("retries=%d", limit), func(t *testing.T) {
			t.Parallel()
			concurrentCommands(t, limit)
		})
	}
}

func concurrentCommands(t *testing.T, limit int) {
	db := testenv.NewDB(t)
	s, r := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{RetryLimit: limit, Backoff: keiro.Backoff{Initial: time.Millisecond}})
	ctx := context.Background()
	const workers, perWorker = 8, 25
	var (
		mu        sync.Mutex
		applied   = map[int]bool{}
		conflicts int
		wg        sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				n := w*perWorker + i + 1 // distinct amounts identify commands
				res, err := r.Run(ctx, db.Pool, "counter-hot", counterCmd{N: n})
				mu.Lock()
				switch {
				case err == nil:
					require.Len(t, res.Events, 1)
					applied[n] = true
				case errors.Is(err, events.ErrRetryExhausted):
					conflicts++
				default:
					t.Errorf("command %d: %v", n, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Equal(t, workers*perWorker, len(applied)+conflicts)
	stored := collect(t, s.ReadStream(ctx, db.Pool, "counter-hot", events.Forward, 0))
	require.Len(t, stored, len(applied))
	seen := map[int]bool{}
	for i, e := range stored {
		require.Equal(t, int64(i+1), e.StreamVersion, "versions are contiguous")
		var a Added
		require.NoError(t, json.Unmarshal(e.Data, &a))
		require.False(t, seen[a.N], "command %d applied twice", a.N)
		require.True(t, applied[a.N], "command %d stored but reported failed", a.N)
		seen[a.N] = true
	}
	t.Logf("%d applied, %d conflicted", len(applied), conflicts)
	if limit < 0 {
		require.Positive(t, conflicts, "8 writers without retries must meet conflicts")
	}
}

func TestRunHooks(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE totals (stream text PRIMARY KEY, total int NOT NULL)`)
	require.NoError(t, err)
	// An inline projection: the read model commits with the events or not at all.
	project := func(ctx context.Context, tx pgx.Tx, res events.Result) error {
		for _, e := range res.Events {
			var a Added
			if err := json.Unmarshal(e.Data, &a); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO totals VALUES ($1, $2)
				ON CONFLICT (stream) DO UPDATE SET total = totals.total + excluded.total`, e.StreamName, a.N); err != nil {
				return err
			}
		}
		return nil
	}
	s, r := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{Hooks: []events.Hook{project}})
	_, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 5})
	require.NoError(t, err)
	boom := errors.New("boom")
	_, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 7}, events.RunOptions{
		Hook: func(context.Context, pgx.Tx, events.Result) error { return boom },
	})
	require.ErrorIs(t, err, boom)
	var total int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT total FROM totals WHERE stream = 'counter-1'`).Scan(&total))
	require.Equal(t, 5, total, "the failed hook rolled back the projection")
	require.Len(t, collect(t, s.ReadStream(ctx, db.Pool, "counter-1", events.Forward, 0)), 1, "and the events")

	// Idempotent command: the same event ids twice append once and run the hook once.
	ids := []envelope.UUID{envelope.NewUUIDv7()}
	corr := envelope.NewUUIDv7()
	opts := events.RunOptions{EventIDs: ids, Metadata: events.Metadata{CorrelationID: &corr, Extra: []byte(`{"actor":"agent-7"}`)}}
	first, err := r.Run(ctx, db.Pool, "counter-2", counterCmd{N: 4}, opts)
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	again, err := r.Run(ctx, db.Pool, "counter-2", counterCmd{N: 4}, opts)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.GlobalPosition, again.GlobalPosition)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT total FROM totals WHERE stream = 'counter-2'`).Scan(&total))
	require.Equal(t, 4, total)
	stored := collect(t, s.ReadStream(ctx, db.Pool, "counter-2", events.Forward, 0))
	require.Len(t, stored, 1)
	require.Equal(t, ids[0], stored[0].ID)
	require.Equal(t, corr, *stored[0].Metadata.CorrelationID)
	require.JSONEq(t, `{"actor":"agent-7"}`, string(stored[0].Metadata.Extra))

	// The same id with other content on another stream is a conflict.
	_, err = r.Run(ctx, db.Pool, "counter-3", counterCmd{N: 9}, opts)
	require.ErrorIs(t, err, events.ErrEventIDConflict)
}

func TestSnapshots(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	ctx := context.Background()
	s, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{SnapshotEvery: 2})
	snapshot := func() (int64, string) {
		var v int64
		var st string
		err := db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT stream_version, state::text FROM %s.keiro_snapshots WHERE stream_name = 'counter-1'`, db.Schema)).Scan(&v, &st)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, ""
		}
		require.NoError(t, err)
		return v, st
	}
	_, err := r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 1})
	require.NoError(t, err)
	v, _ := snapshot()
	require.Zero(t, v, "no snapshot below the threshold")
	_, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 2})
	require.NoError(t, err)
	v, st := snapshot()
	require.Equal(t, int64(2), v)
	require.JSONEq(t, `{"total":3,"events":2}`, st)
	// A 2-event append from v2 crosses 4: snapshot at 4.
	_, err = r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 1, Twice: true})
	require.NoError(t, err)
	v, _ = snapshot()
	require.Equal(t, int64(4), v)

	hits := tm.counter(t, "keiro.snapshot.read.hits")
	state, version, err := r.Load(ctx, db.Pool, "counter-1")
	require.NoError(t, err)
	require.Equal(t, int64(4), version)
	require.Equal(t, counterState{Total: 5, Events: 4}, state)
	require.Equal(t, hits+1, tm.counter(t, "keiro.snapshot.read.hits"))

	// The snapshot really seeds hydration: tamper with it and the state shows it.
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.keiro_snapshots SET state = '{"total":100,"events":4}'`, db.Schema))
	require.NoError(t, err)
	state, _, err = r.Load(ctx, db.Pool, "counter-1")
	require.NoError(t, err)
	require.Equal(t, 100, state.Total)

	// A corrupt snapshot falls back to a full replay.
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.keiro_snapshots SET state = '"not a state"'`, db.Schema))
	require.NoError(t, err)
	misses := tm.counter(t, "keiro.snapshot.read.misses")
	state, _, err = r.Load(ctx, db.Pool, "counter-1")
	require.NoError(t, err)
	require.Equal(t, counterState{Total: 5, Events: 4}, state)
	require.Equal(t, misses+1, tm.counter(t, "keiro.snapshot.read.misses"))
	require.Equal(t, int64(1), tm.counter(t, "keiro.snapshot.decode.failures"))

	// A runner with another state version ignores the snapshot and replays everything.
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.keiro_snapshots SET state = '{"total":100,"events":4}'`, db.Schema))
	require.NoError(t, err)
	_, v2 := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{SnapshotEvery: 2, SnapshotVersion: 2})
	state, _, err = v2.Load(ctx, db.Pool, "counter-1")
	require.NoError(t, err)
	require.Equal(t, 5, state.Total)

	// Hydration refuses a stream with a hole in its versions.
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %s.keiro_events WHERE stream_name = 'counter-1' AND stream_version = 2`, db.Schema))
	require.NoError(t, err)
	_, _, err = v2.Load(ctx, db.Pool, "counter-1")
	require.ErrorIs(t, err, events.ErrHydrationGap)

	// A snapshot that cannot be encoded never fails the committed command.
	_, bad := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{SnapshotEvery: 1,
		EncodeSnapshot: func(counterState) ([]byte, error) { return nil, errors.New("encoder broke") }})
	res, err := bad.Run(ctx, db.Pool, "counter-9", counterCmd{N: 1})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.StreamVersion)
	require.Equal(t, int64(1), tm.counter(t, "keiro.snapshot.encode.failures"))
	require.Zero(t, tm.counter(t, "keiro.snapshot.write.failures"))
	_ = s
}

// TestSnapshotPolicies: OnTerminal snapshots only when the state is terminal; a custom policy
// sees the append span and the new state; Snapshot and SnapshotEvery cannot both be set.
func TestSnapshotPolicies(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	version := func(stream string) int64 {
		var v int64
		err := db.Pool.QueryRow(ctx, `SELECT stream_version FROM keiro_snapshots WHERE stream_name = $1`, stream).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0
		}
		require.NoError(t, err)
		return v
	}
	_, term := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{
		Snapshot: events.SnapshotOnTerminal(func(s counterState) bool { return s.Total >= 10 })})
	for i, want := range []int64{0, 0, 3, 4} {
		_, err := term.Run(ctx, db.Pool, "counter-t", counterCmd{N: 4})
		require.NoError(t, err)
		require.Equal(t, want, version("counter-t"), "after command %d", i+1)
	}
	var seen [][2]int64
	_, custom := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{
		Snapshot: func(pre, post int64, s counterState) bool {
			seen = append(seen, [2]int64{pre, post})
			return s.Events == 3
		}})
	_, err := custom.Run(ctx, db.Pool, "counter-c", counterCmd{N: 1, Twice: true})
	require.NoError(t, err)
	_, err = custom.Run(ctx, db.Pool, "counter-c", counterCmd{N: 1})
	require.NoError(t, err)
	require.Equal(t, [][2]int64{{0, 2}, {2, 3}}, seen)
	require.Equal(t, int64(3), version("counter-c"))

	s := newStore(t, db)
	_, err = events.NewRunner(s, counterDecider, counterCodec(t), events.RunnerConfig[counterState]{
		SnapshotEvery: 2, Snapshot: events.SnapshotEvery[counterState](2)})
	require.ErrorContains(t, err, "set one")
}

// TestRunTooFewEventIDsIsDuplicate: a command re-run with fewer EventIDs than events (the rest
// get fresh ids) is a duplicate, not an id conflict.
func TestRunTooFewEventIDsIsDuplicate(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, r := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	ctx := context.Background()
	opts := events.RunOptions{EventIDs: []envelope.UUID{envelope.NewUUIDv7()}}
	first, err := r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 1, Twice: true}, opts)
	require.NoError(t, err)
	require.Equal(t, int64(2), first.StreamVersion)
	again, err := r.Run(ctx, db.Pool, "counter-1", counterCmd{N: 1, Twice: true}, opts)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Len(t, collect(t, s.ReadStream(ctx, db.Pool, "counter-1", events.Forward, 0)), 2)
}

// TestRunHookConflictIsNotRetried: a hook's error that wraps ErrWrongExpectedVersion (it met a
// conflict on another stream) fails the command at once; it is not the command's own conflict.
func TestRunHookConflictIsNotRetried(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	hookErr := fmt.Errorf("update saga-1: %w", &events.WrongExpectedVersionError{Stream: "saga-1", Expected: events.Exact(3), Actual: 4})
	calls := 0
	_, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{Backoff: keiro.Backoff{Initial: -1},
		Hooks: []events.Hook{func(context.Context, pgx.Tx, events.Result) error { calls++; return hookErr }}})
	ctx := context.Background()
	for _, stream := range []string{"counter-new", "counter-new"} { // a new stream, then (rolled back) again
		calls = 0
		res, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 1})
		require.ErrorIs(t, err, events.ErrWrongExpectedVersion)
		require.NotErrorIs(t, err, events.ErrRetryExhausted)
		require.ErrorContains(t, err, "hook")
		require.Equal(t, 1, res.Attempts)
		require.Equal(t, 1, calls)
	}
	_, plain := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	_, err := plain.Run(ctx, db.Pool, "counter-old", counterCmd{N: 1})
	require.NoError(t, err)
	calls = 0
	res, err := r.Run(ctx, db.Pool, "counter-old", counterCmd{N: 1})
	require.ErrorIs(t, err, events.ErrWrongExpectedVersion)
	require.Equal(t, 1, res.Attempts)
	require.Equal(t, 1, calls)
	require.Zero(t, tm.counter(t, "keiro.command.conflicts"))
	require.Zero(t, tm.counter(t, "keiro.command.retries"))
}

func TestJSONCodec(t *testing.T) {
	c := counterCodec(t)
	require.Error(t, events.RegisterJSON[Added](c, "Added2", 1), "type registered twice")
	require.Error(t, events.RegisterJSON[counterState](c, "State", 1), "not an event")
	require.Error(t, events.RegisterJSON[Reset](c, "Reset", 1), "tag registered twice")

	type AddedV2 struct {
		Amount int `json:"amount"`
	}
	c2 := events.NewJSONCodec[any]()
	require.NoError(t, events.RegisterJSON[AddedV2](c2, "Added", 3))
	rec := events.RecordedEvent{Type: "Added", SchemaVersion: 1, Data: []byte(`{"n":4}`)}
	_, err := c2.Decode(rec)
	require.ErrorContains(t, err, "no upcaster from schema version 1")
	require.NoError(t, c2.Upcast("Added", 1, func(b json.RawMessage) (json.RawMessage, error) {
		var v struct{ N int }
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]int{"count": v.N})
	}))
	require.NoError(t, c2.Upcast("Added", 2, func(b json.RawMessage) (json.RawMessage, error) {
		var v struct{ Count int }
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]int{"amount": v.Count})
	}))
	got, err := c2.Decode(rec)
	require.NoError(t, err)
	require.Equal(t, AddedV2{Amount: 4}, got)
	_, err = c2.Decode(events.RecordedEvent{Type: "Added", SchemaVersion: 4, Data: []byte(`{}`)})
	require.ErrorContains(t, err, "newer")
	require.Error(t, c2.Upcast("Added", 3, nil))
	d, err := c2.Encode(AddedV2{Amount: 1})
	require.NoError(t, err)
	require.Equal(t, int32(3), d.SchemaVersion)
	_, err = c2.Encode(42)
	require.Error(t, err)
}

// TestRunInsideTheCallersTransaction: a runner given the caller's transaction notifies inside it
// (delivered at commit), never from another goroutine on the caller's connection: the caller
// keeps using its transaction undisturbed, and a listener hears the commit.
func TestRunInsideTheCallersTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, r := newCounterRunner(t, db, newTelemetry(), events.RunnerConfig[counterState]{})
	ctx := context.Background()
	listener, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(ctx, `LISTEN "`+s.NotifyChannel()+`"`)
	require.NoError(t, err)

	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for i := range 20 {
			if _, err := r.Run(ctx, tx, "counter-tx", counterCmd{N: 1}); err != nil {
				return err
			}
			for range 10 { // the caller's own statements, right after each command
				var n int
				if err := tx.QueryRow(ctx, "SELECT $1::int", i).Scan(&n); err != nil {
					return err
				}
			}
		}
		return nil
	}))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = listener.Conn().WaitForNotification(wctx)
	require.NoError(t, err, "the commit notified the subscriptions")
	state, _, err := r.Load(ctx, db.Pool, "counter-tx")
	require.NoError(t, err)
	require.Equal(t, 20, state.Total)
}
