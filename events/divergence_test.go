package events_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// skewedCodec is a faulty codec: it stores Added{n} as "Lost" (a tag it cannot decode) when
// lose is set, and as Added{n+1} when skew is set; otherwise it is the counter codec.
type skewedCodec struct {
	inner      events.Codec[counterEvent]
	lose, skew bool
}

func (c skewedCodec) Encode(e counterEvent) (events.EventData, error) {
	d, err := c.inner.Encode(e)
	if a, ok := e.(Added); ok && err == nil {
		switch {
		case c.lose:
			d.Type = "Lost"
		case c.skew:
			d.Data, err = json.Marshal(Added{a.N + 1})
		}
	}
	return d, err
}

func (c skewedCodec) Decode(e events.RecordedEvent) (counterEvent, error) { return c.inner.Decode(e) }

// divergenceRig is a runner over a faulty codec that snapshots every append (or never, with
// snapshot false), with in-memory telemetry.
func divergenceRig(t *testing.T, codec skewedCodec, snapshot bool) (*testenv.DB, *telemetry, *events.Runner[counterState, counterCmd, counterEvent]) {
	t.Helper()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s, err := events.NewStore(events.StoreConfig{Schema: db.Schema, MeterProvider: tm.mp, TracerProvider: tm.tp})
	require.NoError(t, err)
	codec.inner = counterCodec(t)
	cfg := events.RunnerConfig[counterState]{TracerProvider: tm.tp}
	if snapshot {
		cfg.SnapshotEvery = 1
	}
	r, err := events.NewRunner(s, counterDecider, events.Codec[counterEvent](codec), cfg)
	require.NoError(t, err)
	return db, tm, r
}

// divergenceAttr returns the keiro.replay.divergence attribute of stream's command spans.
func divergenceAttr(tm *telemetry, stream string) []string {
	var out []string
	for _, sp := range commandSpans(tm, stream) {
		for _, kv := range sp.Attributes() {
			if kv.Key == "keiro.replay.divergence" {
				out = append(out, kv.Value.AsString())
			}
		}
	}
	return out
}

// TestCommand_ReplayDivergenceIsCountedAndTraced is keiro's "Keiro.Command": "counts and traces
// a just-appended batch that cannot replay". The codec stores an event under a tag it cannot
// decode: the command commits, keiro.snapshot.apply.divergence counts it, the command span
// describes it, no snapshot hides it, and the next command's hydration fails on it.
func TestCommand_ReplayDivergenceIsCountedAndTraced(t *testing.T) {
	t.Parallel()
	db, tm, r := divergenceRig(t, skewedCodec{lose: true}, true)
	ctx := context.Background()
	const stream = "counter-replay-divergence"
	res, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 2, Twice: true})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.StreamVersion)
	require.Equal(t, int64(1), tm.counter(t, "keiro.snapshot.apply.divergence"))
	require.Equal(t, []string{"event_index=0;reason=unknown_event_type"}, divergenceAttr(tm, stream))
	require.Zero(t, snapshotVersion(t, db, stream))
	_, err = r.Run(ctx, db.Pool, stream, counterCmd{N: 3})
	require.ErrorIs(t, err, events.ErrUnknownEventType)
}

// TestCommand_ReplayDivergenceOnTheHookPath is keiro's "Keiro.Command": "witnesses replay
// divergence on the transactional SQL append path". A command with a hook (the append in a
// transaction) is checked the same way; here the codec changes the data it stores, so every
// event folds but to another state than the one decided.
func TestCommand_ReplayDivergenceOnTheHookPath(t *testing.T) {
	t.Parallel()
	db, tm, r := divergenceRig(t, skewedCodec{skew: true}, true)
	ctx := context.Background()
	const stream = "counter-replay-divergence-hook"
	hooked := 0
	res, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 2, Twice: true}, events.RunOptions{
		Hook: func(context.Context, pgx.Tx, events.Result) error { hooked++; return nil },
	})
	require.NoError(t, err)
	require.Equal(t, 1, hooked)
	require.Len(t, res.Events, 2)
	require.Equal(t, int64(1), tm.counter(t, "keiro.snapshot.apply.divergence"))
	require.Equal(t, []string{"event_index=1;reason=state_mismatch"}, divergenceAttr(tm, stream))
	require.Zero(t, snapshotVersion(t, db, stream))
	state, _, err := r.Load(ctx, db.Pool, stream)
	require.NoError(t, err)
	require.Equal(t, counterState{Total: 6, Events: 2}, state, "what the log holds, not the decided 4")
}

// TestCommand_NoReplayCheckWithoutSnapshots is keiro's "Keiro.Command": "skips replay
// verification for a snapshot-less stream when disabled". keiro-go replays a batch only where
// it would write a snapshot: without a snapshot policy the same faulty codec costs nothing and
// counts nothing, and a faithful codec with snapshots counts nothing either.
func TestCommand_NoReplayCheckWithoutSnapshots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, tm, r := divergenceRig(t, skewedCodec{skew: true}, false)
	_, err := r.Run(ctx, db.Pool, "counter-no-snapshots", counterCmd{N: 2})
	require.NoError(t, err)
	require.Zero(t, tm.counter(t, "keiro.snapshot.apply.divergence"))
	require.Empty(t, divergenceAttr(tm, "counter-no-snapshots"))

	db, tm, r = divergenceRig(t, skewedCodec{}, true)
	_, err = r.Run(ctx, db.Pool, "counter-faithful", counterCmd{N: 2, Twice: true})
	require.NoError(t, err)
	require.Zero(t, tm.counter(t, "keiro.snapshot.apply.divergence"))
	require.Equal(t, int64(2), snapshotVersion(t, db, "counter-faithful"))
}
