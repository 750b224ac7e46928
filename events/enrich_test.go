package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// markEnriched is an enrichment hook: it adds "enriched": true to the event's Extra metadata
// object (creating it when there is none) and refuses the stream "enrich-refused".
func markEnriched(_ context.Context, stream string, e events.EventData) (events.EventData, error) {
	if stream == "enrich-refused" {
		return e, errors.New("enricher refused the stream")
	}
	extra := map[string]any{}
	if len(e.Metadata.Extra) > 0 {
		if err := json.Unmarshal(e.Metadata.Extra, &extra); err != nil {
			return e, err
		}
	}
	extra["enriched"] = true
	raw, err := json.Marshal(extra)
	if err != nil {
		return e, err
	}
	e.Metadata.Extra = raw
	return e, nil
}

// requireEnriched checks that every event carries the enrichment marker and keeps the writer's
// own Extra fields.
func requireEnriched(t *testing.T, evs []events.RecordedEvent) {
	t.Helper()
	require.NotEmpty(t, evs)
	for _, e := range evs {
		var extra map[string]any
		require.NoError(t, json.Unmarshal(e.Metadata.Extra, &extra), "%s v%d", e.StreamName, e.StreamVersion)
		require.Equal(t, true, extra["enriched"], "%s v%d", e.StreamName, e.StreamVersion)
		require.Equal(t, "agent-7", extra["actor"], "%s v%d: the writer's metadata is kept", e.StreamName, e.StreamVersion)
	}
}

// TestCommand_EnrichmentParity is keiro's "Keiro.Command enrichment parity": "applies the store
// enrichment hook to both command append paths". keiro-go's runner has more paths than two
// (the pipelined first append on a new stream, the autocommit append without hooks, the
// transaction with hooks, the caller's transaction) and the store's AppendTx: StoreConfig.Enrich
// runs on each, the hooks see the enriched events, and an Enrich error fails the append.
func TestCommand_EnrichmentParity(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	s, err := events.NewStore(events.StoreConfig{Schema: db.Schema, Enrich: markEnriched})
	require.NoError(t, err)
	r, err := events.NewRunner(s, counterDecider, counterCodec(t), events.RunnerConfig[counterState]{})
	require.NoError(t, err)
	opts := events.RunOptions{Metadata: events.Metadata{Extra: json.RawMessage(`{"actor":"agent-7"}`)}}
	stored := func(stream string) []events.RecordedEvent {
		return collect(t, s.ReadStream(ctx, db.Pool, stream, events.Forward, 0))
	}

	// Without hooks: the pipelined creation of a new stream, then the autocommit append.
	for range 2 {
		_, err = r.Run(ctx, db.Pool, "enrich-plain", counterCmd{N: 1}, opts)
		require.NoError(t, err)
	}
	require.Len(t, stored("enrich-plain"), 2)
	requireEnriched(t, stored("enrich-plain"))

	// With a hook: the creation in an open transaction, then the append with the hook; the hook
	// receives the enriched events.
	var seen []events.RecordedEvent
	hooked := opts
	hooked.Hook = func(_ context.Context, _ pgx.Tx, res events.Result) error {
		seen = append(seen, res.Events...)
		return nil
	}
	for range 2 {
		_, err = r.Run(ctx, db.Pool, "enrich-transactional", counterCmd{N: 1, Twice: true}, hooked)
		require.NoError(t, err)
	}
	require.Len(t, seen, 4)
	requireEnriched(t, seen)
	requireEnriched(t, stored("enrich-transactional"))

	// In the caller's transaction, and through the store's own AppendTx.
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := r.Run(ctx, tx, "enrich-caller", counterCmd{N: 2}, opts); err != nil {
			return err
		}
		data := ev("Added", `{"n":3}`)
		data.Metadata = opts.Metadata
		_, err := s.AppendTx(ctx, tx, "enrich-append", events.NoStream, data)
		return err
	}))
	requireEnriched(t, stored("enrich-caller"))
	requireEnriched(t, stored("enrich-append"))

	// An Enrich error fails the command and stores nothing.
	_, err = r.Run(ctx, db.Pool, "enrich-refused", counterCmd{N: 1}, opts)
	require.ErrorContains(t, err, "enricher refused the stream")
	require.Empty(t, stored("enrich-refused"))
	_, err = appendTx(t, db, s, "enrich-refused", events.Any, ev("Added", `{"n":1}`))
	require.ErrorContains(t, err, "enricher refused the stream")
	require.Empty(t, stored("enrich-refused"))
}
