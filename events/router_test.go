package events_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

var sampleSource = mustParseUUID("018f0f18-17aa-7000-8000-0000000000aa")

func mustParseUUID(s string) envelope.UUID {
	u, err := envelope.ParseUUID(s)
	if err != nil {
		panic(err)
	}
	return u
}

func TestDeterministicIDsMatchKeiro(t *testing.T) {
	t.Parallel()
	// Computed with Python's uuid.uuid5(uuid.NAMESPACE_URL, …) over keiro's field encodings.
	require.Equal(t, "6ef980f1-7a65-5833-aaab-ce0ad5ba0e00",
		events.RouterCommandID("billing", "order-1", sampleSource, "invoice-1", 0).String())
	require.Equal(t, "6daef3a0-e71e-555d-9bd2-d593ebcb6b04",
		events.ProcessManagerCommandID("counter-pm", "order-1", sampleSource, -1).String())
}

func TestRouterCommandIDsDoNotCollide(t *testing.T) {
	t.Parallel()
	// Without length prefixes "a:b"+"c" and "a"+"b:c" would be one name.
	a := events.RouterCommandID("r", "a:b", sampleSource, "c-1", 0)
	b := events.RouterCommandID("r", "a", sampleSource, "b:c-1", 0)
	require.NotEqual(t, a, b)
	// Non-ASCII: byte lengths, not rune counts.
	c := events.RouterCommandID("r", "é", sampleSource, "x-1", 0)
	d := events.RouterCommandID("r", "e\u0301", sampleSource, "x-1", 0)
	require.NotEqual(t, c, d)
	require.NotEqual(t, events.RouterCommandID("r", "k", sampleSource, "x-1", 0),
		events.RouterCommandID("r", "k", sampleSource, "x-1", 1))
}

// groupRouter fans an input out to the members of its group, read from a read-model table.
type groupInput struct{ Group string }

func newGroupRouter(t *testing.T, db *testenv.DB) (*events.Store, *events.Runner[counterState, counterCmd, counterEvent], *events.Router[groupInput, counterCmd]) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE group_members (group_id text, target text, ord int)`)
	require.NoError(t, err)
	s, target := newCounterRunner(t, db, newTelemetry(), events.RunnerConfig[counterState]{})
	r, err := events.NewRouter(s, events.RouterConfig[groupInput, counterCmd]{
		Name: "fanout",
		Key:  func(in groupInput) string { return in.Group },
		Resolve: func(ctx context.Context, in groupInput) ([]events.Command[counterCmd], error) {
			rows, err := db.Pool.Query(ctx, `SELECT target FROM group_members WHERE group_id = $1 ORDER BY ord`, in.Group)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var cmds []events.Command[counterCmd]
			for rows.Next() {
				var target string
				if err := rows.Scan(&target); err != nil {
					return nil, err
				}
				cmds = append(cmds, events.Command[counterCmd]{Stream: target, Command: counterCmd{N: 1}})
			}
			return cmds, rows.Err()
		},
		Target: target,
	})
	require.NoError(t, err)
	return s, target, r
}

func setMembers(t *testing.T, db *testenv.DB, group string, targets ...string) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `DELETE FROM group_members WHERE group_id = $1`, group)
	require.NoError(t, err)
	for i, target := range targets {
		_, err := db.Pool.Exec(ctx, `INSERT INTO group_members VALUES ($1, $2, $3)`, group, target, i)
		require.NoError(t, err)
	}
}

func outcomes(res []events.CommandResult) []events.CommandOutcome {
	out := make([]events.CommandOutcome, len(res))
	for i, r := range res {
		out[i] = r.Outcome
	}
	return out
}

func streamLen(t *testing.T, s *events.Store, db *testenv.DB, stream string) int {
	t.Helper()
	n := 0
	for _, err := range s.ReadStream(context.Background(), db.Pool, stream, events.Forward, 0) {
		require.NoError(t, err)
		n++
	}
	return n
}

const (
	appended  = events.CommandAppended
	duplicate = events.CommandDuplicate
	failed    = events.CommandFailed
)

func TestRouterRedeliveryDispatchesNothingTwice(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _, r := newGroupRouter(t, db)
	ctx := context.Background()
	setMembers(t, db, "g1", "counter-a", "counter-b", "counter-c")

	res, err := r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{appended, appended, appended}, outcomes(res.Commands))
	require.NoError(t, res.Err())

	empty, err := r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"unseeded"})
	require.NoError(t, err)
	require.Empty(t, empty.Commands)

	again, err := r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{duplicate, duplicate, duplicate}, outcomes(again.Commands))
	for i, c := range again.Commands {
		require.Equal(t, res.Commands[i].CommandID, c.CommandID)
	}
	for _, stream := range []string{"counter-a", "counter-b", "counter-c"} {
		require.Equal(t, 1, streamLen(t, s, db, stream), stream)
	}

	// The target's event carries the command id and is caused by the source.
	var stored events.RecordedEvent
	for e, err := range s.ReadStream(ctx, db.Pool, "counter-a", events.Forward, 0) {
		require.NoError(t, err)
		stored = e
	}
	require.Equal(t, events.RouterCommandID("fanout", "g1", sampleSource, "counter-a", 0), stored.ID)
	require.Equal(t, sampleSource, *stored.Metadata.CausationID)
}

func TestRouterReorderedTargetsAfterPartialDispatch(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _, r := newGroupRouter(t, db)
	ctx := context.Background()

	// A first delivery dispatched only b (the others were not resolved yet).
	setMembers(t, db, "g1", "counter-b")
	res, err := r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{appended}, outcomes(res.Commands))

	// The redelivery resolves c, b, a: b is recognised by its target, not its position.
	setMembers(t, db, "g1", "counter-c", "counter-b", "counter-a")
	res, err = r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{appended, duplicate, appended}, outcomes(res.Commands))

	// A full-completion order swap is all duplicates.
	setMembers(t, db, "g1", "counter-a", "counter-c", "counter-b")
	res, err = r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{duplicate, duplicate, duplicate}, outcomes(res.Commands))
	for _, stream := range []string{"counter-a", "counter-b", "counter-c"} {
		require.Equal(t, 1, streamLen(t, s, db, stream), stream)
	}
}

func TestRouterNewTargetOnRedeliveryIsDispatched(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _, r := newGroupRouter(t, db)
	ctx := context.Background()
	setMembers(t, db, "g1", "counter-a", "counter-b")
	_, err := r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)

	// The read model drifted: b left, d joined. d is dispatched, a is a duplicate, b keeps
	// its earlier event.
	setMembers(t, db, "g1", "counter-a", "counter-d")
	res, err := r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{duplicate, appended}, outcomes(res.Commands))
	for _, stream := range []string{"counter-a", "counter-b", "counter-d"} {
		require.Equal(t, 1, streamLen(t, s, db, stream), stream)
	}
}

func TestRouterSameTargetTwiceInOneBatch(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _, r := newGroupRouter(t, db)
	ctx := context.Background()
	setMembers(t, db, "g1", "counter-a", "counter-a")
	res, err := r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{appended, appended}, outcomes(res.Commands))
	require.NotEqual(t, res.Commands[0].CommandID, res.Commands[1].CommandID)
	res, err = r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{duplicate, duplicate}, outcomes(res.Commands))
	require.Equal(t, 2, streamLen(t, s, db, "counter-a"))
}

func TestRouterConcurrentDuplicateIsBenign(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, target, r := newGroupRouter(t, db)
	ctx := context.Background()
	setMembers(t, db, "g1", "counter-a")
	id := events.RouterCommandID("fanout", "g1", sampleSource, "counter-a", 0)
	// Another delivery appends the same command between the pre-check and the append.
	events.SetBeforeAppend(target, func(ctx context.Context, stream string, attempt int) {
		if attempt != 1 {
			return
		}
		_, err := appendTx(t, db, s, stream, events.Any, events.EventData{
			ID: id, Type: "Added", SchemaVersion: 1, Data: []byte(`{"n":7}`)})
		require.NoError(t, err)
	})
	res, err := r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{duplicate}, outcomes(res.Commands))
	require.Equal(t, id, res.Commands[0].CommandID)
	require.Equal(t, 1, streamLen(t, s, db, "counter-a"))
}

func TestRouterFailuresAreReportedPerCommand(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, target, _ := newGroupRouter(t, db)
	ctx := context.Background()
	r, err := events.NewRouter(s, events.RouterConfig[groupInput, counterCmd]{
		Name: "mixed", Key: func(in groupInput) string { return in.Group },
		Resolve: func(context.Context, groupInput) ([]events.Command[counterCmd], error) {
			return []events.Command[counterCmd]{
				{Stream: "failing-target", Command: counterCmd{N: -1}}, // not a valid stream name
				{Stream: "counter-rejects", Command: counterCmd{N: -1}},
				{Stream: "counter-ok", Command: counterCmd{N: 1}},
			}, nil
		},
		Target: target,
	})
	require.NoError(t, err)
	res, err := r.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.NoError(t, err)
	require.Equal(t, []events.CommandOutcome{failed, failed, appended}, outcomes(res.Commands))
	require.ErrorContains(t, res.Err(), "negative amount")

	boom := errors.New("read model unavailable")
	r2, err := events.NewRouter(s, events.RouterConfig[groupInput, counterCmd]{
		Name: "broken", Key: func(in groupInput) string { return in.Group },
		Resolve: func(context.Context, groupInput) ([]events.Command[counterCmd], error) { return nil, boom },
		Target:  target,
	})
	require.NoError(t, err)
	_, err = r2.Dispatch(ctx, db.Pool, sampleSource, groupInput{"g1"})
	require.ErrorIs(t, err, boom)
	_, err = r2.Dispatch(ctx, db.Pool, envelope.UUID{}, groupInput{"g1"})
	require.ErrorContains(t, err, "zero UUID")

	_, err = events.NewRouter[groupInput, counterCmd](nil, events.RouterConfig[groupInput, counterCmd]{})
	require.ErrorContains(t, err, "store is nil")
	require.ErrorContains(t, err, "Name: required")
	require.ErrorContains(t, err, "Key: required")
	require.ErrorContains(t, err, "Resolve: required")
	require.ErrorContains(t, err, "Target: required")
}
