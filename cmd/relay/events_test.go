package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestEventsDeadListAndReplay: a subscription dead-letters a poison event; `relay events dead
// list` shows it, `relay events dead replay` makes the running subscription deliver it again.
func TestEventsDeadListAndReplay(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	store, err := events.NewStore(events.StoreConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"Ok", "Poison", "Ok"} {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := store.AppendTx(ctx, tx, "ledger-1", events.Any, events.EventData{Type: typ, Data: []byte(`{}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var broken atomic.Bool
	broken.Store(true)
	commits := make(chan int64, 16)
	sub, err := events.NewSubscription(store, db.Pool, events.SubscriptionConfig{Name: "ledger",
		Retry:       events.RetryPolicy{MaxDeliveries: 1},
		AfterCommit: func(p int64) { commits <- p }},
		func(_ context.Context, _ pgx.Tx, e events.RecordedEvent) error {
			if e.Type == "Poison" && broken.Load() {
				return errors.New("no rule for Poison")
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- sub.Run(rctx) }()
	defer func() { cancel(); <-errc }() //nolint:errcheck // Run returns the cancellation
	for p := int64(0); p < 3; p = <-commits {
	}

	base := []string{"--database-url=" + testenv.DatabaseURL(), "--schema=" + db.Schema}
	run := func(args ...string) result { return invoke(t, append(base, args...)...) }
	r := run("events", "dead", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "no rule for Poison") || !strings.Contains(r.stdout, "ledger-1@2") {
		t.Fatalf("events dead list: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = run("events", "dead", "list", "--subscription=ledger", "--json")
	var d events.DeadLetter
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &d); err != nil || d.Status != "dead" ||
		d.EventType != "Poison" || d.Attempts != 1 || d.ErrorClass != events.ErrorClassMaxDeliveries {
		t.Fatalf("events dead list --json: %v\n%s", err, r.stdout)
	}
	if r = run("events", "dead", "list", "--subscription=other", "--json"); r.code != 0 || r.stdout != "" {
		t.Fatalf("other subscription: %d %q", r.code, r.stdout)
	}
	if r = run("events", "dead", "replay", "--subscription=ledger"); r.code == 0 || !strings.Contains(r.stderr, "--all") {
		t.Fatalf("replay without ids or --all: %d %s", r.code, r.stderr)
	}
	if r = run("events", "dead", "replay", "--subscription=ledger", "999"); r.code == 0 || !strings.Contains(r.stderr, "not dead letters") {
		t.Fatalf("replay of an unknown id: %d %s", r.code, r.stderr)
	}

	broken.Store(false)
	r = run("events", "dead", "replay", "--subscription=ledger", "--all")
	if r.code != 0 || !strings.Contains(r.stdout, "1 dead letters") {
		t.Fatalf("events dead replay: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	<-commits // the replay's commit
	r = run("events", "dead", "list", "--status=replayed", "--json")
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &d); err != nil || d.Status != "replayed" || d.ReplayedAt == nil {
		t.Fatalf("after replay: %v\n%s", err, r.stdout)
	}
}
