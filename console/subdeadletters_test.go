package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestSubscriptionDeadLettersListAndReplay runs a real subscription whose handler fails for
// good on one event: the console lists the dead letter (page and API, filtered by
// subscription and status), refuses bad filters and requests, and after the fix a replay
// confirmed on its page is delivered by the running subscription, which marks it replayed.
func TestSubscriptionDeadLettersListAndReplay(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx := context.Background()
	store, err := events.NewStore(events.StoreConfig{Schema: r.db.Schema})
	require.NoError(t, err)
	for _, typ := range []string{"Ok", "Poison", "Ok"} {
		require.NoError(t, pgx.BeginFunc(ctx, r.db.Pool, func(tx pgx.Tx) error {
			_, err := store.AppendTx(ctx, tx, "ledger-1", events.Any, events.EventData{Type: typ, SchemaVersion: 1, Data: json.RawMessage(`{}`)})
			return err
		}))
	}
	var broken atomic.Bool
	broken.Store(true)
	replayed := make(chan int64, 4)
	p := new(testenv.Progress)
	sub, err := events.NewSubscription(store, r.db.Pool, events.SubscriptionConfig{
		Name: "ledger", AfterCommit: p.Set,
	}, func(ctx context.Context, _ pgx.Tx, e events.RecordedEvent) error {
		if e.Type == "Poison" && broken.Load() {
			return events.Permanent(errors.New("cannot apply Poison: unknown currency <XXX>"))
		}
		if events.IsDeadLetterReplay(ctx) {
			replayed <- e.GlobalPosition
		}
		return nil
	})
	require.NoError(t, err)
	subCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- sub.Run(subCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("subscription: %v", err)
		}
	})
	p.Wait(t, 3, time.Minute, errc)

	var page console.SubscriptionDeadLetters
	a := r.get(t, "/api/v1/subscriptions/dead-letters?subscription=ledger")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &page)
	require.Len(t, page.Rows, 1, a.body)
	d := page.Rows[0]
	require.Equal(t, "Poison", d.EventType)
	require.Equal(t, events.ErrorClassPermanent, d.ErrorClass)
	require.Equal(t, events.DeadLetterDead, d.Status)
	a = r.get(t, "/api/v1/subscriptions/dead-letters?subscription=other")
	page = console.SubscriptionDeadLetters{}
	a.json(t, &page)
	require.Empty(t, page.Rows)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/api/v1/subscriptions/dead-letters?status=gone").code)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/api/v1/subscriptions/dead-letters?cursor=x").code)
	require.Equal(t, http.StatusBadRequest, r.postJSON(t, "/api/v1/subscriptions/dead-letters/replay",
		console.SubscriptionReplayRequest{IDs: []int64{d.ID}}).code, "the subscription is required")
	require.Equal(t, http.StatusBadRequest, r.postJSON(t, "/api/v1/subscriptions/dead-letters/replay",
		console.SubscriptionReplayRequest{Subscription: "ledger"}).code, "ids or all")

	list := r.get(t, "/console/subscriptions/dead-letters")
	require.Equal(t, http.StatusOK, list.code, list.body)
	require.Contains(t, list.body, "unknown currency &lt;XXX&gt;")
	value := "ledger/" + strconv.FormatInt(d.ID, 10)
	require.Contains(t, list.body, `value="`+value+`"`)
	require.Contains(t, r.get(t, "/console/subscriptions").body, `href="/console/subscriptions/dead-letters"`)

	// Fixed: the confirmation names the event, the confirmed replay answers 303, the running
	// subscription delivers it and marks it replayed.
	broken.Store(false)
	form := url.Values{"csrf_token": {r.csrf(t)}, "dead_letter": {value}}
	conf := r.postForm(t, "/console/subscriptions/dead-letters/replay", form.Encode())
	require.Equal(t, http.StatusOK, conf.code, conf.body)
	require.Contains(t, conf.body, "Replay 1 dead letter(s) of ledger?")
	require.Contains(t, conf.body, "ledger-1@2")
	form.Set("confirm", "yes")
	res := r.follow(t, r.postForm(t, "/console/subscriptions/dead-letters/replay", form.Encode()))
	require.Equal(t, http.StatusOK, res.code, res.body)
	require.Contains(t, res.body, "1 dead letter(s) of ledger requested for replay")
	require.Equal(t, d.GlobalPosition, <-replayed)

	testenv.WaitFor(t, 30*time.Second, "the dead letter marked replayed", func() bool {
		page = console.SubscriptionDeadLetters{}
		r.get(t, "/api/v1/subscriptions/dead-letters?status=replayed").json(t, &page)
		return len(page.Rows) == 1
	})
	require.NotNil(t, page.Rows[0].ReplayedAt)

	// Nothing left to replay: the API says so.
	var ans console.SubscriptionReplayAnswer
	a = r.postJSON(t, "/api/v1/subscriptions/dead-letters/replay", console.SubscriptionReplayRequest{Subscription: "ledger", All: true})
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &ans)
	require.Zero(t, ans.Requested)
	require.Contains(t, r.logs.String(), "subscription dead-letter replay")
}
