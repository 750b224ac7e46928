package events_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// snapshotVersion returns the stream version of stream's snapshot row, 0 when there is none.
func snapshotVersion(t *testing.T, db *testenv.DB, stream string) int64 {
	t.Helper()
	var v int64
	err := db.Pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT stream_version FROM %s.keiro_snapshots WHERE stream_name = $1`, db.Schema), stream).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return v
}

// TestSnapshot_WriteFailureDoesNotFailTheCommand is keiro's "Keiro.Snapshot": "does not fail a
// committed command when the post-commit snapshot write fails". While the snapshot table refuses
// every write the command still commits and reports its version; the failure is counted in
// keiro.snapshot.write.failures; once the table accepts writes again, snapshots resume.
func TestSnapshot_WriteFailureDoesNotFailTheCommand(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	ctx := context.Background()
	s, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{SnapshotEvery: 2})
	const stream = "snapshot-write-failure"
	_, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 2})
	require.NoError(t, err)

	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s.keiro_snapshots ADD CONSTRAINT keiro_snapshots_no_writes CHECK (false) NOT VALID`, db.Schema))
	require.NoError(t, err)
	res, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 3})
	require.NoError(t, err, "the snapshot write failed after the commit")
	require.Equal(t, int64(2), res.StreamVersion)
	require.Len(t, res.Events, 1)
	stored := collect(t, s.ReadStream(ctx, db.Pool, stream, events.Forward, 0))
	require.Len(t, stored, 2)
	require.JSONEq(t, `{"n":3}`, string(stored[1].Data))
	require.Zero(t, snapshotVersion(t, db, stream), "no snapshot while writes are refused")
	require.Equal(t, int64(1), tm.counter(t, "keiro.snapshot.write.failures"))
	require.Zero(t, tm.counter(t, "keiro.snapshot.encode.failures"))

	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s.keiro_snapshots DROP CONSTRAINT keiro_snapshots_no_writes`, db.Schema))
	require.NoError(t, err)
	for _, n := range []int{4, 5} {
		_, err = r.Run(ctx, db.Pool, stream, counterCmd{N: n})
		require.NoError(t, err)
	}
	require.Equal(t, int64(4), snapshotVersion(t, db, stream))
	require.Equal(t, int64(1), tm.counter(t, "keiro.snapshot.write.failures"))
	state, version, err := r.Load(ctx, db.Pool, stream)
	require.NoError(t, err)
	require.Equal(t, int64(4), version)
	require.Equal(t, counterState{Total: 14, Events: 4}, state)
}

// TestSnapshot_EncodeFailureDoesNotFailTheCommand is keiro's "Keiro.Snapshot": "does not fail a
// committed command when strict snapshot encoding fails". keiro's strict encoder fails on an
// empty register slot; a Go runner's EncodeSnapshot that returns an error is the same case.
func TestSnapshot_EncodeFailureDoesNotFailTheCommand(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	ctx := context.Background()
	s, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{SnapshotEvery: 1,
		EncodeSnapshot: func(counterState) ([]byte, error) { return nil, errors.New("register slot is empty") }})
	const stream = "snapshot-encode-failure"
	res, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 7})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.StreamVersion)
	require.Len(t, res.Events, 1)
	stored := collect(t, s.ReadStream(ctx, db.Pool, stream, events.Forward, 0))
	require.Len(t, stored, 1)
	require.JSONEq(t, `{"n":7}`, string(stored[0].Data))
	require.Zero(t, snapshotVersion(t, db, stream))
	require.Equal(t, int64(1), tm.counter(t, "keiro.snapshot.encode.failures"))
	require.Zero(t, tm.counter(t, "keiro.snapshot.write.failures"))
}

// TestSnapshot_IncompatibleCodecReplacesAHigherVersionRow is keiro's "Keiro.Snapshot": "allows
// an incompatible snapshot codec to replace a higher-version row". A snapshot of another state
// version replaces the row even at a lower stream version (a rolled-back deployment re-seeds its
// streams), while one of the same state version never replaces a newer row (a late writer
// cannot move the snapshot back). The replaced snapshot then seeds the other version's runner.
func TestSnapshot_IncompatibleCodecReplacesAHigherVersionRow(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, v1 := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{SnapshotEvery: 1})
	const stream = "snapshot-codec-rollback"
	for n := 1; n <= 4; n++ {
		_, err := v1.Run(ctx, db.Pool, stream, counterCmd{N: n})
		require.NoError(t, err)
	}
	require.Equal(t, int64(4), snapshotVersion(t, db, stream))

	// The same state version at a lower stream version: the newer row stays.
	require.NoError(t, events.WriteSnapshot(ctx, v1, db.Pool, stream, 2, counterState{Total: 3, Events: 2}))
	require.Equal(t, int64(4), snapshotVersion(t, db, stream))

	// Another state version at a lower stream version replaces it.
	_, v2 := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{SnapshotEvery: 1, SnapshotVersion: 2})
	require.NoError(t, events.WriteSnapshot(ctx, v2, db.Pool, stream, 2, counterState{Total: 3, Events: 2}))
	require.Equal(t, int64(2), snapshotVersion(t, db, stream))
	var stateVersion int32
	require.NoError(t, db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT state_version FROM %s.keiro_snapshots WHERE stream_name = $1`, db.Schema), stream).Scan(&stateVersion))
	require.Equal(t, int32(2), stateVersion)

	// v2 hydrates from its snapshot at 2 and replays 3 and 4; v1 ignores it and replays all.
	for _, r := range []*events.Runner[counterState, counterCmd, counterEvent]{v2, v1} {
		state, version, err := r.Load(ctx, db.Pool, stream)
		require.NoError(t, err)
		require.Equal(t, int64(4), version)
		require.Equal(t, counterState{Total: 10, Events: 4}, state)
	}
}

// TestSnapshot_FallsBackAfterOperatorTruncation is keiro's "Keiro.Snapshot": "falls back after
// operator truncation". Snapshots are advisory: after an operator empties the snapshot table the
// next command replays the whole stream (a miss, not a decode failure) and succeeds.
func TestSnapshot_FallsBackAfterOperatorTruncation(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	ctx := context.Background()
	_, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{SnapshotEvery: 1})
	const stream = "snapshot-operator-truncate"
	for _, n := range []int{2, 3} {
		_, err := r.Run(ctx, db.Pool, stream, counterCmd{N: n})
		require.NoError(t, err)
	}
	require.Equal(t, int64(2), snapshotVersion(t, db, stream))
	misses := tm.counter(t, "keiro.snapshot.read.misses")

	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`TRUNCATE %s.keiro_snapshots`, db.Schema))
	require.NoError(t, err)
	res, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 4})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.StreamVersion)
	require.Equal(t, misses+1, tm.counter(t, "keiro.snapshot.read.misses"))
	require.Zero(t, tm.counter(t, "keiro.snapshot.decode.failures"))
	state, _, err := r.Load(ctx, db.Pool, stream)
	require.NoError(t, err)
	require.Equal(t, counterState{Total: 9, Events: 3}, state)
}

// truncateBefore deletes stream's events below version, as an operator truncating a stream's
// prefix does (keiro's setStreamTruncateBefore).
func truncateBefore(t *testing.T, db *testenv.DB, stream string, version int64) {
	t.Helper()
	tag, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`DELETE FROM %s.keiro_events WHERE stream_name = $1 AND stream_version < $2`, db.Schema), stream, version)
	require.NoError(t, err)
	require.Equal(t, version-1, tag.RowsAffected())
}

// TestCommand_TruncationWithoutCoveringSnapshot is keiro's "Keiro.Command": "rejects hydration
// after truncation without a covering snapshot". With versions 1 and 2 gone and no snapshot,
// hydration meets version 3 first and fails with ErrHydrationGap naming both versions; nothing
// is appended.
func TestCommand_TruncationWithoutCoveringSnapshot(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	s, r := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	const stream = "counter-truncated-uncovered"
	for n := 1; n <= 3; n++ {
		_, err := r.Run(ctx, db.Pool, stream, counterCmd{N: n})
		require.NoError(t, err)
	}
	truncateBefore(t, db, stream, 3)
	_, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 4})
	require.ErrorIs(t, err, events.ErrHydrationGap)
	require.ErrorContains(t, err, "expected version 1, found 3")
	require.Len(t, collect(t, s.ReadStream(ctx, db.Pool, stream, events.Forward, 0)), 1)
}

// TestCommand_TruncationInsideACommandBatch is keiro's "Keiro.Command": "rejects hydration when
// truncation lands inside a command batch". The first event of a two-event command is gone:
// hydration fails on the second rather than fold half a command.
func TestCommand_TruncationInsideACommandBatch(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, r := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	const stream = "counter-truncated-mid-batch"
	_, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 1, Twice: true})
	require.NoError(t, err)
	truncateBefore(t, db, stream, 2)
	_, err = r.Run(ctx, db.Pool, stream, counterCmd{N: 2})
	require.ErrorIs(t, err, events.ErrHydrationGap)
	require.ErrorContains(t, err, "expected version 1, found 2")
}

// TestCommand_TruncationCoveredBySnapshot is keiro's "Keiro.Command": "hydrates normally after
// truncation covered by a snapshot". A snapshot at version 2 covers the deleted version 1:
// hydration starts from it and the command appends version 3.
func TestCommand_TruncationCoveredBySnapshot(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, r := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{SnapshotEvery: 2})
	const stream = "counter-truncated-covered"
	for _, n := range []int{1, 2} {
		_, err := r.Run(ctx, db.Pool, stream, counterCmd{N: n})
		require.NoError(t, err)
	}
	require.Equal(t, int64(2), snapshotVersion(t, db, stream))
	truncateBefore(t, db, stream, 2)
	res, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 3})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.StreamVersion)
	state, version, err := r.Load(ctx, db.Pool, stream)
	require.NoError(t, err)
	require.Equal(t, int64(3), version)
	require.Equal(t, counterState{Total: 6, Events: 3}, state)
}
