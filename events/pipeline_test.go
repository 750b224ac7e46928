package events_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// roundTrips counts the statements and batches a pool sends.
type roundTrips struct{ queries, batches atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.queries.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.batches.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestRunOneRoundTripOnNewStream: a command on a new stream is one batch (hydration and append
// pipelined) and no other statement; on an existing stream the batch hydrates and one append
// follows. Results are the same as the unpipelined path's.
func TestRunOneRoundTripOnNewStream(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	rt := &roundTrips{}
	cfg, err := pgxpool.ParseConfig(db.ConnString)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := events.NewStore(events.StoreConfig{Schema: db.Schema, DisableNotify: true})
	require.NoError(t, err)
	r, err := events.NewRunner(s, counterDecider, counterCodec(t), events.RunnerConfig[counterState]{})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, pool.Ping(ctx))

	rt.queries.Store(0)
	res, err := r.Run(ctx, pool, "counter-1", counterCmd{N: 2})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.StreamVersion)
	require.Len(t, res.Events, 1)
	require.Equal(t, int64(1), rt.batches.Load())
	require.Zero(t, rt.queries.Load(), "nothing besides the batch")

	res, err = r.Run(ctx, pool, "counter-1", counterCmd{N: 3})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.StreamVersion)
	require.Equal(t, int64(2), rt.batches.Load())
	require.Equal(t, int64(1), rt.queries.Load(), "the append on the hydrated state")
	state, v, err := r.Load(ctx, pool, "counter-1")
	require.NoError(t, err)
	require.Equal(t, int64(2), v)
	require.Equal(t, counterState{Total: 5, Events: 2}, state)

	// A rejection on the initial state proves nothing: the stream is read alone.
	_, err = r.Run(ctx, pool, "counter-2", counterCmd{N: -1})
	require.ErrorContains(t, err, "negative amount")
	require.Equal(t, int64(2), rt.batches.Load())
}
