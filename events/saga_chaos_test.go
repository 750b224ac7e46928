package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

const (
	sagaChaosOrders = 150
	sagaChaosKills  = 6
	sagaChildEnv    = "KEIRO_SAGA_CHILD_SCHEMA"
)

// sagaRig is the counter process manager fed from the inbox and from its timers.
type sagaRig struct {
	store   *events.Store
	pm      *events.ProcessManager[counterState, pmIn, counterEvent, counterCmd]
	inbox   *inbox.Store
	handler func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error
	fire    events.FireFunc
}

func newSagaRig(t testing.TB, schema string) *sagaRig {
	t.Helper()
	s, err := events.NewStore(events.StoreConfig{Schema: schema})
	require.NoError(t, err)
	target, err := events.NewRunner(s, counterDecider, counterCodec(t), events.RunnerConfig[counterState]{})
	require.NoError(t, err)
	pm, err := events.NewProcessManager(s, events.ProcessManagerConfig[counterState, pmIn, counterEvent, counterCmd]{
		Name: "counter", Correlate: func(in pmIn) string { return in.Order },
		Handle: counterPMHandle, Evolve: counterDecider.Evolve, Codec: counterCodec(t), Target: target,
	})
	require.NoError(t, err)
	st, err := inbox.NewStore(inbox.StoreConfig{Schema: schema, Consumer: "billing"})
	require.NoError(t, err)
	h, err := pm.InboxHandler(func(ev envelope.Event) (pmIn, error) {
		var in pmIn
		err := json.Unmarshal(ev.Payload, &in)
		return in, err
	}, events.DispatchPolicy{})
	require.NoError(t, err)
	fire, err := pm.TimerFire(func(tm events.Timer) (pmIn, error) {
		var p struct{ Kind string }
		err := json.Unmarshal(tm.Payload, &p)
		return pmIn{Kind: p.Kind, Order: tm.CorrelationID}, err
	}, events.DispatchPolicy{})
	require.NoError(t, err)
	return &sagaRig{store: s, pm: pm, inbox: st, handler: h, fire: fire}
}

// deliverAll processes every order's OrderPlaced through the inbox, in order, as a consumer
// restarted from the first offset would: the inbox recognises what committed.
func (r *sagaRig) deliverAll(ctx context.Context, pool *pgxpool.Pool) error {
	for i := range sagaChaosOrders {
		order := fmt.Sprintf("order-%d", i)
		payload, _ := json.Marshal(pmIn{"placed", order})
		ev := envelope.Event{MessageID: "placed-" + order, Source: "ordering", Destination: "ordering.orders.v1", EventType: "OrderPlaced",
			SchemaVersion: 1, ContentType: "application/json", Payload: payload, OccurredAt: pmFireAt}
		res, err := r.inbox.Process(ctx, pool, inbox.Delivery{Event: ev}, r.handler)
		if err != nil {
			return err
		}
		if res.Outcome != inbox.Processed && res.Outcome != inbox.Duplicate {
			return fmt.Errorf("order %s: %s: %v", order, res.Outcome, res.Err)
		}
	}
	return nil
}

// runWorkers fires timers with two workers until ctx ends.
func (r *sagaRig) runWorkers(t testing.TB, ctx context.Context, pool *pgxpool.Pool) <-chan error {
	t.Helper()
	errc := make(chan error, 2)
	for range 2 {
		w, err := events.NewTimerWorker(r.store, pool, events.TimerWorkerConfig{Fire: r.fire, BatchSize: 5,
			RequeueStuckAfter: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		go func() { errc <- w.Run(ctx) }()
	}
	return errc
}

// TestSagaChildProcess is the process TestSagaSurvivesKill9 kills: it consumes the orders
// through the inbox and fires the saga's timers until it is killed. Run on its own (without
// KEIRO_SAGA_CHILD_SCHEMA) it checks that the rig builds.
func TestSagaChildProcess(t *testing.T) {
	schema := os.Getenv(sagaChildEnv)
	if schema == "" {
		newSagaRig(t, testenv.NewDB(t).Schema)
		return
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	require.NoError(t, err)
	r := newSagaRig(t, schema)
	errc := r.runWorkers(t, ctx, pool)
	for {
		if err := r.deliverAll(ctx, pool); err != nil {
			fmt.Fprintln(os.Stderr, "deliver:", err)
		}
		select {
		case err := <-errc:
			t.Fatalf("timer worker stopped: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestSagaSurvivesKill9: a process that consumes OrderPlaced through the inbox and fires the
// saga's timers is killed with SIGKILL again and again, mid-transaction; a last one finishes.
// Every saga ends in exactly one terminal state (placed, then timed out: two manager events),
// no command is applied twice (each target holds exactly its two events, 1 + 5), and no timer is
// lost (every one fired, none dead).
func TestSagaSurvivesKill9(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for k := range sagaChaosKills {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSagaChildProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), sagaChildEnv+"="+db.Schema)
		require.NoError(t, cmd.Start())
		time.Sleep(time.Duration(150+rng.IntN(400)) * time.Millisecond) // the kill lands wherever the child is
		require.NoError(t, cmd.Process.Kill(), "kill %d", k)
		_ = cmd.Wait()
	}

	var done, timersFired int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_inbox`).Scan(&done))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_timers WHERE status = 'fired'`).Scan(&timersFired))
	t.Logf("before the survivor: %d of %d orders consumed, %d timers fired", done, sagaChaosOrders, timersFired)

	// The survivor: a consumer restarted from the first offset, and timer workers.
	r := newSagaRig(t, db.Schema)
	wctx, stop := context.WithCancel(ctx)
	errc := r.runWorkers(t, wctx, db.Pool)
	require.NoError(t, r.deliverAll(ctx, db.Pool))
	deadline := time.Now().Add(time.Minute)
	for {
		var live int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_timers WHERE status IN ('scheduled', 'firing')`).Scan(&live))
		var total int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_timers`).Scan(&total))
		if live == 0 && total == sagaChaosOrders {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d of %d timers still live", live, total)
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	for range 2 {
		require.ErrorIs(t, <-errc, context.Canceled)
	}

	var fired, dead int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'fired'), count(*) FILTER (WHERE status = 'dead') FROM keiro_timers`).Scan(&fired, &dead))
	require.Equal(t, int64(sagaChaosOrders), fired)
	require.Zero(t, dead)
	for i := range sagaChaosOrders {
		order := fmt.Sprintf("order-%d", i)
		state, version, err := r.pm.Load(ctx, db.Pool, order)
		require.NoError(t, err)
		require.Equal(t, int64(2), version, order)
		require.Equal(t, 11, state.Total, order)
		var target []int
		for e, err := range r.store.ReadStream(ctx, db.Pool, "counter-target-"+order, events.Forward, 0) {
			require.NoError(t, err)
			var a Added
			require.NoError(t, json.Unmarshal(e.Data, &a))
			target = append(target, a.N)
		}
		require.Equal(t, []int{1, 5}, target, order)
	}
}
