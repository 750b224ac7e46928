package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// refusing is a target that rejects every command.
type refusing struct{}

func (refusing) Run(_ context.Context, _ keiro.DB, stream string, _ string, _ ...events.RunOptions) (events.Result, error) {
	return events.Result{}, &events.RejectedError{Stream: stream, Err: errors.New("invoice closed")}
}

// TestEventsDispatchAndTimers: `relay events dispatch list` shows a router's dead letter;
// `relay events timers stuck|requeue|cancel` show and repair a timer left firing.
func TestEventsDispatchAndTimers(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	store, err := events.NewStore(events.StoreConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	r, err := events.NewRouter(store, events.RouterConfig[string, string]{Name: "billing", Key: func(s string) string { return s },
		Resolve: func(_ context.Context, s string) ([]events.Command[string], error) {
			return []events.Command[string]{{Stream: "invoice-" + s, Command: "open"}}, nil
		},
		Target: refusing{}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := r.EventHandler(func(events.RecordedEvent) (string, error) { return "o1", nil }, events.DispatchPolicy{OnRejected: events.RejectedDeadLetter})
	if err != nil {
		t.Fatal(err)
	}
	src := envelope.NewUUIDv7()
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return h(ctx, tx, events.RecordedEvent{ID: src, GlobalPosition: 4, StreamName: "order-o1", StreamVersion: 1})
	}); err != nil {
		t.Fatal(err)
	}

	timer := envelope.NewUUIDv7()
	if _, err := store.ScheduleTimerTx(ctx, db.Pool, events.TimerRequest{ID: timer, ProcessManager: "payment", CorrelationID: "o1",
		FireAt: time.Now().Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	w, err := events.NewTimerWorker(store, db.Pool, events.TimerWorkerConfig{Fire: func(context.Context, pgx.Tx, events.Timer) (envelope.UUID, error) {
		return envelope.UUID{}, errors.New("worker died")
	}})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, err := w.RunOnce(ctx); err != nil || out != events.TimerFireFailed {
		t.Fatalf("fire: %s, %v", out, err)
	}

	base := []string{"--database-url=" + testenv.DatabaseURL(), "--schema=" + db.Schema}
	run := func(args ...string) result { return invoke(t, append(base, args...)...) }
	res := run("events", "dispatch", "list")
	if res.code != 0 || !strings.Contains(res.stdout, "invoice-o1") || !strings.Contains(res.stdout, "command_rejected") ||
		!strings.Contains(res.stdout, src.String()) {
		t.Fatalf("events dispatch list: %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	res = run("events", "dispatch", "list", "--dispatcher=billing", "--json")
	var d events.DispatchDeadLetter
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &d); err != nil || d.Kind != "router" || d.CorrelationID != "o1" {
		t.Fatalf("events dispatch list --json: %v\n%s", err, res.stdout)
	}
	if res = run("events", "dispatch", "list", "--dispatcher=other", "--json"); res.code != 0 || res.stdout != "" {
		t.Fatalf("another dispatcher: %d %q", res.code, res.stdout)
	}

	res = run("events", "timers", "stuck")
	if res.code != 0 || !strings.Contains(res.stdout, "0 timers due, 1 firing") || !strings.Contains(res.stdout, timer.String()) ||
		!strings.Contains(res.stdout, "worker died") {
		t.Fatalf("events timers stuck: %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	if res = run("events", "timers", "stuck", "--min-attempts=2", "--json"); res.code != 0 || res.stdout != "" {
		t.Fatalf("events timers stuck --min-attempts=2: %d %q", res.code, res.stdout)
	}
	if res = run("events", "timers", "requeue", timer.String()); res.code != 0 || !strings.Contains(res.stdout, "requeued") {
		t.Fatalf("events timers requeue: %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	if res = run("events", "timers", "requeue", timer.String()); res.code == 0 || !strings.Contains(res.stdout, "left alone") {
		t.Fatalf("a second requeue: %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	if res = run("events", "timers", "cancel", timer.String()); res.code != 0 || !strings.Contains(res.stdout, "cancelled") {
		t.Fatalf("events timers cancel: %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	if res = run("events", "timers", "cancel", "not-a-uuid"); res.code == 0 || !strings.Contains(res.stderr, "not-a-uuid") {
		t.Fatalf("a bad id: %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	got, err := store.GetTimer(ctx, db.Pool, timer)
	if err != nil || got.Status != events.TimerCancelled {
		t.Fatalf("timer after cancel: %+v, %v", got, err)
	}
}
