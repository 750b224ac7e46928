package events_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// commandSpans returns the ended command spans of stream (the runner names them after it).
func commandSpans(tm *telemetry, stream string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, sp := range tm.spans.Ended() {
		if sp.Name() == stream {
			out = append(out, sp)
		}
	}
	return out
}

// TestCommand_RetryAttemptOnSpan is keiro's "Keiro.Command": "records the successful retry
// attempt on the command span". A writer slips in before the first append; the command
// succeeds on its second attempt and its one span says keiro.retry.attempt = 2.
func TestCommand_RetryAttemptOnSpan(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	ctx := context.Background()
	s, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{Backoff: keiro.Backoff{Initial: -1}})
	const stream = "counter-retry-span"
	_, err := appendTx(t, db, s, stream, events.NoStream, ev("Added", `{"n":1}`))
	require.NoError(t, err)
	events.SetBeforeAppend(r, func(_ context.Context, stream string, attempt int) {
		if attempt == 1 {
			_, err := appendTx(t, db, s, stream, events.Any, ev("Added", `{"n":10}`))
			require.NoError(t, err)
		}
	})
	res, err := r.Run(ctx, db.Pool, stream, counterCmd{N: 2})
	require.NoError(t, err)
	require.Equal(t, 2, res.Attempts)
	require.Equal(t, int64(3), res.StreamVersion)
	spans := commandSpans(tm, stream)
	require.Len(t, spans, 1)
	var attempt int64
	for _, kv := range spans[0].Attributes() {
		if kv.Key == "keiro.retry.attempt" {
			attempt = kv.Value.AsInt64()
		}
	}
	require.Equal(t, int64(2), attempt)
}

// TestCommand_CountsDuplicateDeterministicEvents is keiro's "Keiro.Command": "counts duplicate
// deterministic command events". A command whose caller-chosen event id is already stored, in
// another stream, fails with ErrEventIDConflict and counts one keiro.command.duplicates.
func TestCommand_CountsDuplicateDeterministicEvents(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	ctx := context.Background()
	_, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{})
	opts := events.RunOptions{EventIDs: []envelope.UUID{envelope.NewUUIDv7()}}
	_, err := r.Run(ctx, db.Pool, "counter-duplicate-a", counterCmd{N: 1}, opts)
	require.NoError(t, err)
	require.Zero(t, tm.counter(t, "keiro.command.duplicates"))
	_, err = r.Run(ctx, db.Pool, "counter-duplicate-b", counterCmd{N: 2}, opts)
	require.ErrorIs(t, err, events.ErrEventIDConflict)
	require.Equal(t, int64(1), tm.counter(t, "keiro.command.duplicates"))
}

// TestCommand_SpanErrorStatusIsTruncated is keiro's "Keiro.Command": "truncates command span
// error status descriptions". A stored event of an unknown 400-character type fails hydration
// with an error that names it; the span's status description keeps at most 256 bytes of it.
func TestCommand_SpanErrorStatusIsTruncated(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	ctx := context.Background()
	s, r := newCounterRunner(t, db, tm, events.RunnerConfig[counterState]{})
	const stream = "counter-long-decode-failure"
	_, err := appendTx(t, db, s, stream, events.NoStream, ev(strings.Repeat("x", 400), `{}`))
	require.NoError(t, err)
	_, err = r.Run(ctx, db.Pool, stream, counterCmd{N: 1})
	require.ErrorIs(t, err, events.ErrUnknownEventType)
	require.Greater(t, len(err.Error()), 400)
	spans := commandSpans(tm, stream)
	require.Len(t, spans, 1)
	require.Equal(t, codes.Error, spans[0].Status().Code)
	require.NotEmpty(t, spans[0].Status().Description)
	require.LessOrEqual(t, len(spans[0].Status().Description), 256)
}

// TestCommand_HookGetsTheWholeBatchInOrder is keiro's "Keiro.Command": "passes the complete
// multi-event batch to inline SQL in append order". A two-event command's hook receives both
// events, in stream order, with the ids the caller chose for them.
func TestCommand_HookGetsTheWholeBatchInOrder(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, r := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	ids := []envelope.UUID{envelope.NewUUIDv7(), envelope.NewUUIDv7()}
	var seen []events.RecordedEvent
	res, err := r.Run(ctx, db.Pool, "counter-multi-hook", counterCmd{N: 8, Twice: true}, events.RunOptions{
		EventIDs: ids,
		Hook: func(_ context.Context, _ pgx.Tx, res events.Result) error {
			seen = res.Events
			return nil
		},
	})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.StreamVersion)
	require.Len(t, seen, 2)
	for i, e := range seen {
		require.Equal(t, ids[i], e.ID)
		require.Equal(t, int64(i+1), e.StreamVersion)
		require.Equal(t, "Added", e.Type)
		require.JSONEq(t, `{"n":8}`, string(e.Data))
	}
	require.Less(t, seen[0].GlobalPosition, seen[1].GlobalPosition)
}

// TestCommand_HookEventsMatchTheStoredBatch is keiro's "Keiro.Command": "reconstructed
// RecordedEvents match the stored batch". The events a hook and the Result receive are built
// from the append's answer, not read back: they must equal what a stream read and a category
// read return (ids, types, versions, positions, data, metadata, times).
func TestCommand_HookEventsMatchTheStoredBatch(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	s, r := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{})
	corr := envelope.NewUUIDv7()
	var seen []events.RecordedEvent
	res, err := r.Run(ctx, db.Pool, "counter-reconstruct", counterCmd{N: 8, Twice: true}, events.RunOptions{
		Metadata: events.Metadata{CorrelationID: &corr, Extra: []byte(`{"actor":"agent-7"}`)},
		Hook: func(_ context.Context, _ pgx.Tx, res events.Result) error {
			seen = res.Events
			return nil
		},
	})
	require.NoError(t, err)
	stored := collect(t, s.ReadStream(ctx, db.Pool, "counter-reconstruct", events.Forward, 0))
	category := collect(t, s.ReadCategory(ctx, db.Pool, "counter", 0))
	require.Len(t, stored, 2)
	normalise := func(evs []events.RecordedEvent) []events.RecordedEvent {
		out := make([]events.RecordedEvent, len(evs))
		for i, e := range evs {
			e.RecordedAt = e.RecordedAt.UTC()
			out[i] = e
		}
		return out
	}
	require.Equal(t, normalise(stored), normalise(seen))
	require.Equal(t, normalise(stored), normalise(res.Events))
	require.Equal(t, normalise(stored), normalise(category))
}
