package logmode_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/logmode"
)

// An engine with Destinations creates its publication with a row filter: the slot sends it
// only its destinations' rows (a transaction of other destinations only is not sent at all),
// and it confirms past them. An engine of another set on the same slot refuses to run.
func TestDestinationsFilterOnTheServer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders", "payments"}})
	ctx := context.Background()
	slot := f.db.Schema + "_keiro_log_orders"
	t.Cleanup(func() { dropSlot(t, f.db.Pool, slot) })
	cfg := f.cfg
	cfg.Slot, cfg.Destinations = slot, []string{"orders"}
	acks := &testenv.Progress{}
	active := make(chan struct{}, 1)
	var decoded, confirmed atomic.Uint64
	run(t, f.newEngine(t, cfg, logmode.Hooks{
		OnAck: func(string) { acks.Add(1) },
		OnActive: func() { // never blocks the engine: a stuck test must not hang its cleanup
			select {
			case active <- struct{}{}:
			default:
			}
		},
		OnCommit: func(end pglogrepl.LSN) { decoded.Store(uint64(end)) },
		OnReport: func(pos pglogrepl.LSN) { confirmed.Store(uint64(pos)) },
	}))
	select {
	case <-active:
	case <-time.After(time.Minute):
		t.Fatal("the engine did not start replicating")
	}
	var filter string
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT rowfilter FROM pg_publication_tables WHERE pubname = $1`, slot).Scan(&filter))
	require.Contains(t, filter, "'orders'")

	commitEvents(t, f.db.Pool, event{id: "o1", dest: "orders", key: "k"}, event{id: "p1", dest: "payments", key: "k"})
	commitEvents(t, f.db.Pool, event{id: "p2", dest: "payments", key: "k"})
	commitEvents(t, f.db.Pool, event{id: "o2", dest: "orders", key: "k"})
	var lsn string
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn))
	end, err := pglogrepl.ParseLSN(lsn)
	require.NoError(t, err)
	acks.Wait(t, 2, time.Minute, nil)
	testenv.WaitFor(t, time.Minute, "the engine confirmed past the last commit", func() bool {
		return pglogrepl.LSN(confirmed.Load()) >= end
	})
	require.Equal(t, []string{"o1", "o2"}, ids(f.kafka.Records(t, "orders")))
	require.Empty(t, f.kafka.Records(t, "payments"))
	require.NotZero(t, decoded.Load())

	// The same slot for another set: its publication is not that set's.
	other := cfg
	other.Destinations = []string{"payments"}
	e := f.newEngine(t, other, logmode.Hooks{})
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = e.Run(rctx)
	require.Error(t, err)
	require.False(t, errors.Is(err, context.DeadlineExceeded))
	require.ErrorContains(t, err, "publication "+slot+" publishes the destinations orders, and this relay the destinations payments")
}
