package console_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
)

// TestSagasShowsDispatchDeadLettersAndTimers: a command a router dead-lettered and the timers
// due and firing are on the sagas page and in GET /api/v1/sagas, filtered by dispatcher and
// paged; an empty store says so; a bad limit is refused.
func TestSagasShowsDispatchDeadLettersAndTimers(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx := context.Background()
	store, err := events.NewStore(events.StoreConfig{Schema: r.db.Schema})
	require.NoError(t, err)

	var empty console.Sagas
	a := r.get(t, "/api/v1/sagas")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &empty)
	require.Empty(t, empty.DeadLetters)
	require.Empty(t, empty.Firing)
	page := r.get(t, "/console/sagas")
	require.Equal(t, http.StatusOK, page.code, page.body)
	require.Contains(t, page.body, `id="no-dispatch"`)
	require.Contains(t, page.body, `id="no-firing"`)

	// A router's rejected command, as RejectedDeadLetter records it.
	source, cmd := envelope.NewUUIDv7(), envelope.NewUUIDv7()
	for i, name := range []string{"billing-router", "shipping-router"} {
		_, err = r.db.Pool.Exec(ctx, `INSERT INTO keiro_dispatch_dead_letters (dispatcher_kind, dispatcher_name,
			correlation_id, source_event_id, source_global_position, emit_index, target_stream_name, command_id,
			error_class, error_detail) VALUES ('router', $1, 'order-7', $2, 7, $3, 'invoice-7', $4, $5, $6)`,
			name, [16]byte(source), i, [16]byte(cmd), events.ErrorClassCommandRejected, "negative amount <-5>")
		require.NoError(t, err)
	}
	// One timer due and waiting, one claimed by a worker that went away.
	now := time.Now()
	due, firing := envelope.NewUUIDv7(), envelope.NewUUIDv7()
	for _, id := range []envelope.UUID{due, firing} {
		_, err = store.ScheduleTimerTx(ctx, r.db.Pool, events.TimerRequest{ID: id, ProcessManager: "payment",
			CorrelationID: "order-7", FireAt: now.Add(-time.Minute)})
		require.NoError(t, err)
	}
	_, err = r.db.Pool.Exec(ctx, `UPDATE keiro_timers SET status = 'firing', attempts = 2, last_error = 'worker gone'
		WHERE timer_id = $1`, [16]byte(firing))
	require.NoError(t, err)

	var s console.Sagas
	a = r.get(t, "/api/v1/sagas")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &s)
	require.Len(t, s.DeadLetters, 2, a.body)
	require.Equal(t, "invoice-7", s.DeadLetters[0].TargetStream)
	require.Equal(t, events.DispatcherRouter, s.DeadLetters[0].Kind)
	require.Equal(t, int64(1), s.TimersDue)
	require.Equal(t, int64(1), s.TimersFiring)
	require.Len(t, s.Firing, 1)
	require.Equal(t, firing, s.Firing[0].ID)
	require.Equal(t, "worker gone", s.Firing[0].LastError)

	s = console.Sagas{}
	r.get(t, "/api/v1/sagas?dispatcher=billing-router").json(t, &s)
	require.Len(t, s.DeadLetters, 1)
	require.Equal(t, "billing-router", s.DeadLetters[0].Dispatcher)
	s = console.Sagas{}
	r.get(t, "/api/v1/sagas?limit=1").json(t, &s)
	require.Len(t, s.DeadLetters, 1)
	require.True(t, s.DeadLettersMore)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/api/v1/sagas?limit=-1").code)

	page = r.get(t, "/console/sagas")
	require.Equal(t, http.StatusOK, page.code, page.body)
	require.Contains(t, page.body, "negative amount &lt;-5&gt;")
	require.Contains(t, page.body, "billing-router")
	require.Contains(t, page.body, firing.String())
	require.Contains(t, page.body, "worker gone")
	require.Contains(t, r.get(t, "/console/subscriptions").body, `href="/console/sagas"`)
}
