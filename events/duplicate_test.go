package events_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// duplicateFixture is a store with an event of id stored in stream, and the error a changed
// append of id to into gets from the store (ErrEventIDConflict, as a dispatch meets it).
func duplicateFixture(t *testing.T, stream string, id envelope.UUID, into string) (*testenv.DB, *events.Store, error) {
	t.Helper()
	db := testenv.NewDB(t)
	s, err := events.NewStore(events.StoreConfig{Schema: db.Schema})
	require.NoError(t, err)
	e := ev("Added", `{"n":1}`)
	e.ID = id
	_, err = appendTx(t, db, s, stream, events.Any, e)
	require.NoError(t, err)
	changed := ev("Added", `{"n":2}`)
	changed.ID = id
	_, conflict := appendTx(t, db, s, into, events.Any, changed)
	require.ErrorIs(t, conflict, events.ErrEventIDConflict)
	return db, s, conflict
}

// TestProcessManager_DuplicateReportWithAnotherID is keiro's "Keiro.ProcessManager duplicate
// confirmation": "rejects a duplicate report carrying a different id". The target stream holds
// another id than the command's: the conflict is not the command's duplicate.
func TestProcessManager_DuplicateReportWithAnotherID(t *testing.T) {
	t.Parallel()
	const target = "dup-mismatch"
	ours, other := envelope.NewUUIDv7(), envelope.NewUUIDv7()
	db, s, conflict := duplicateFixture(t, target, other, target)
	require.False(t, events.BenignDuplicate(context.Background(), s, db.Pool, target, ours, conflict))
}

// TestProcessManager_DuplicateIDOnlyInAnotherStream is keiro's "Keiro.ProcessManager duplicate
// confirmation": "rejects a matching id that exists only in another stream". The command's id is
// stored, but in another stream than its target: a collision, never a benign duplicate.
func TestProcessManager_DuplicateIDOnlyInAnotherStream(t *testing.T) {
	t.Parallel()
	const target, other = "dup-target", "dup-other"
	ours := envelope.NewUUIDv7()
	db, s, conflict := duplicateFixture(t, other, ours, target)
	_, err := appendTx(t, db, s, target, events.Any, ev("Added", `{"n":1}`))
	require.NoError(t, err)
	require.False(t, events.BenignDuplicate(context.Background(), s, db.Pool, target, ours, conflict))
}

// TestProcessManager_DuplicateConfirmedInTargetStream is keiro's "Keiro.ProcessManager duplicate
// confirmation": "confirms matching and id-less duplicate reports when the id is in the target
// stream". keiro-go's conflict errors carry no id (keiro's id-less report); the stored id in the
// target stream confirms the duplicate either way.
func TestProcessManager_DuplicateConfirmedInTargetStream(t *testing.T) {
	t.Parallel()
	const target = "dup-present"
	ours := envelope.NewUUIDv7()
	db, s, conflict := duplicateFixture(t, target, ours, target)
	ctx := context.Background()
	require.True(t, events.BenignDuplicate(ctx, s, db.Pool, target, ours, conflict))
	bare := fmt.Errorf("dispatch: %w", events.ErrEventIDConflict)
	require.True(t, events.BenignDuplicate(ctx, s, db.Pool, target, ours, bare))
}

// TestProcessManager_NonDuplicateFailureIsNotConfirmed is keiro's "Keiro.ProcessManager
// duplicate confirmation": "rejects non-duplicate command failures". With the id in the target
// stream, a failure that is not an id conflict (a lost connection, a version conflict, a
// rejection) is still that failure.
func TestProcessManager_NonDuplicateFailureIsNotConfirmed(t *testing.T) {
	t.Parallel()
	const target = "dup-non-duplicate"
	ours := envelope.NewUUIDv7()
	db, s, _ := duplicateFixture(t, target, ours, target)
	ctx := context.Background()
	for _, err := range []error{
		errors.New("connection lost"),
		&events.WrongExpectedVersionError{Stream: target, Expected: events.NoStream, Actual: 1},
		&events.RejectedError{Stream: target, Err: errors.New("negative amount")},
	} {
		require.False(t, events.BenignDuplicate(ctx, s, db.Pool, target, ours, err), "%v", err)
	}
}
