package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/inbox"
)

func TestInboxSummaryAndFailures(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)

	var s console.InboxSummary
	a := r.get(t, "/api/v1/inbox/summary")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &s)
	require.Equal(t, []console.ConsumerCounts{{Consumer: consumerName}}, s.Consumers, "empty state lists the configured consumer")
	var page console.InboxPage
	r.get(t, "/api/v1/inbox/failed").json(t, &page)
	require.Empty(t, page.Rows)

	require.Equal(t, inbox.Processed, r.process(t, event("ok-1", "orders.v1", ptr("A"), `{"n":1}`), 0, 1).Outcome)
	require.Equal(t, inbox.Poisoned, r.process(t, event("bad-1", "orders.v1", ptr("B"), `{"n":"poison"}`), 0, 2).Outcome)
	require.Equal(t, inbox.Poisoned, r.process(t, event("bad-2", "orders.v1", ptr("C"), `{"n":"poison 2"}`), 1, 5).Outcome)
	// A key with a slash and a colon (the kafka-delivery policy's shape) stays addressable.
	odd := event("topic/with:colon", "orders.v1", nil, `{"n":"poison 3"}`)
	require.Equal(t, inbox.Poisoned, r.process(t, odd, 1, 6).Outcome)
	r.exec(t, `UPDATE keiro_inbox SET poisoned = false WHERE dedupe_key = 'bad-2'`) // a retrying row

	s = console.InboxSummary{}
	r.get(t, "/api/v1/inbox/summary").json(t, &s)
	require.Len(t, s.Consumers, 1)
	c := s.Consumers[0]
	require.Equal(t, int64(1), c.Completed)
	require.Equal(t, int64(1), c.Retrying)
	require.Equal(t, int64(2), c.Poisoned)
	require.NotNil(t, c.OldestFailureAgeSeconds)
	var done, failed int64
	for _, b := range s.LastHour {
		done += b.Sent
		failed += b.Failed
	}
	require.Equal(t, int64(1), done)
	require.Equal(t, int64(3), failed)

	r.get(t, "/api/v1/inbox/failed").json(t, &page)
	require.Len(t, page.Rows, 3)
	require.Equal(t, "bad-1", page.Rows[0].DedupeKey, "oldest failure first")
	require.True(t, page.Rows[0].Poisoned)
	require.Contains(t, page.Rows[0].LastError, "payload is poison")
	require.Equal(t, &console.KafkaPosition{Topic: "orders.v1", Partition: 0, Offset: 2}, page.Rows[0].Kafka)

	var walked []string
	cursor := ""
	for range 5 {
		page = console.InboxPage{}
		r.get(t, "/api/v1/inbox/failed?limit=2&cursor="+url.QueryEscape(cursor)).json(t, &page)
		for _, e := range page.Rows {
			walked = append(walked, e.DedupeKey)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	require.Equal(t, []string{"bad-1", "bad-2", "topic/with:colon"}, walked)
	for _, bad := range []string{"cursor=zz", "cursor=e30", "limit=-1"} {
		require.Equal(t, http.StatusBadRequest, r.get(t, "/api/v1/inbox/failed?"+bad).code, bad)
	}

	var e console.InboxEntry
	a = r.get(t, "/api/v1/inbox/failed/orders/"+url.PathEscape("topic/with:colon"))
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &e)
	require.Equal(t, "topic/with:colon", e.DedupeKey)
	require.JSONEq(t, `{"n":"poison 3"}`, string(e.Payload.JSON))
	require.Contains(t, e.Headers, console.Header{Key: "keiro-source", Value: "orders"})
	require.Equal(t, http.StatusNotFound, r.get(t, "/api/v1/inbox/failed/orders/nope").code)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/api/v1/inbox/failed/orders/").code, "a key is required")
}

func TestInboxRetryAPI(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	r.process(t, event("bad-1", "orders.v1", ptr("B"), `{"n":"poison"}`), 0, 2)
	r.process(t, event("bad-2", "orders.v1", ptr("C"), `{"n":"poison"}`), 0, 3)
	r.process(t, event("ok-1", "orders.v1", ptr("A"), `{"n":1}`), 0, 4)

	// Still broken: the re-run fails again and counts an attempt.
	var ans console.RetryAnswer
	a := r.postJSON(t, "/api/v1/inbox/retry", console.RetryRequest{Keys: []console.RetryKey{{Source: "orders", DedupeKey: "bad-1"}}})
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &ans)
	require.Equal(t, 1, ans.Failed)
	require.Equal(t, "poisoned", ans.Results[0].Outcome)
	require.Equal(t, 2, ans.Results[0].Attempts)

	r.fix()
	ans = console.RetryAnswer{}
	r.postJSON(t, "/api/v1/inbox/retry", console.RetryRequest{Keys: []console.RetryKey{
		{Source: "orders", DedupeKey: "bad-1"}, {Source: "orders", DedupeKey: "ok-1"}, {Source: "orders", DedupeKey: "missing"},
	}}).json(t, &ans)
	require.Equal(t, []string{"processed", "duplicate", "error"},
		[]string{ans.Results[0].Outcome, ans.Results[1].Outcome, ans.Results[2].Outcome})
	require.Contains(t, ans.Results[2].Error, "not found")
	require.Equal(t, 2, ans.Succeeded)
	require.Equal(t, 1, ans.Failed)

	ans = console.RetryAnswer{}
	r.postJSON(t, "/api/v1/inbox/retry", console.RetryRequest{All: true}).json(t, &ans)
	require.Len(t, ans.Results, 1)
	require.Equal(t, "bad-2", ans.Results[0].DedupeKey)
	require.Equal(t, "processed", ans.Results[0].Outcome)
	var e console.InboxEntry
	r.get(t, "/api/v1/inbox/failed/orders/bad-2").json(t, &e)
	require.Equal(t, "completed", e.Status)
	require.Contains(t, r.logs.String(), "console: inbox retry")

	for name, bad := range map[string]any{
		"empty":    console.RetryRequest{},
		"both":     console.RetryRequest{All: true, Keys: []console.RetryKey{{Source: "a", DedupeKey: "b"}}},
		"half key": console.RetryRequest{Keys: []console.RetryKey{{Source: "a"}}},
		"too many": console.RetryRequest{Keys: make([]console.RetryKey, console.MaxSelection+1)},
	} {
		a := r.postJSON(t, "/api/v1/inbox/retry", bad)
		require.Equal(t, http.StatusBadRequest, a.code, name+": "+a.body)
	}
}

func TestInboxRetryWithoutHandler(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *console.Config) { c.Inbox.Handler = nil })
	a := r.postJSON(t, "/api/v1/inbox/retry", console.RetryRequest{All: true})
	require.Equal(t, http.StatusNotImplemented, a.code)
	require.NotContains(t, r.get(t, "/console/inbox").body, "Retry selected")
}

// TestConsumerLag reads the group's committed offsets and the log end offsets from Kafka: a
// partition that stops moving shows a growing lag.
func TestConsumerLag(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx := context.Background()

	var lag console.ConsumerLag
	a := r.get(t, "/api/v1/consumer/lag")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &lag)
	require.Empty(t, lag.Partitions, "a group that never committed")

	r.kc.CreateTopic(t, "orders.v1", 2)
	cl := r.kc.NewClient(t, kgo.DefaultProduceTopic("orders.v1"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produceN := func(p int32, n int) {
		for range n {
			require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte("x")}).FirstErr())
		}
	}
	produceN(0, 3)
	produceN(1, 5)
	adm := kadm.NewClient(r.kc.NewClient(t))
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "orders.v1", Partition: 0, At: 3})
	offs.Add(kadm.Offset{Topic: "orders.v1", Partition: 1, At: 2})
	_, err := adm.CommitOffsets(ctx, consumerName, offs)
	require.NoError(t, err)

	lag = console.ConsumerLag{}
	r.get(t, "/api/v1/consumer/lag").json(t, &lag)
	require.Equal(t, consumerName, lag.Group)
	require.Equal(t, []console.PartitionLag{
		{Topic: "orders.v1", Partition: 0, Committed: 3, End: 3, Lag: 0},
		{Topic: "orders.v1", Partition: 1, Committed: 2, End: 5, Lag: 3},
	}, lag.Partitions)
	require.Equal(t, int64(3), lag.TotalLag)

	produceN(1, 4) // partition 1 is stuck: its lag grows with every record
	lag = console.ConsumerLag{}
	r.get(t, "/api/v1/consumer/lag").json(t, &lag)
	require.Equal(t, int64(7), lag.Partitions[1].Lag)
	require.Contains(t, r.get(t, "/console/").body, `<b id="total-lag">7</b>`)
}

func TestConsumerLagWithoutKafka(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *console.Config) { c.Inbox.Kafka = nil })
	a := r.get(t, "/api/v1/consumer/lag")
	require.Equal(t, http.StatusNotImplemented, a.code)
	require.Contains(t, a.body, "no Kafka client")
	require.Contains(t, r.get(t, "/console/").body, "no Kafka client")
}

// TestConsumerLagKafkaDown: an unreachable cluster is a 502 naming the group, and the
// overview still renders.
func TestConsumerLagKafkaDown(t *testing.T) {
	t.Parallel()
	var dead *kgo.Client
	r := newRig(t, func(c *console.Config) {
		var err error
		dead, err = kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.RequestRetries(0), kgo.RetryTimeout(time.Second))
		require.NoError(t, err)
		c.Inbox.Kafka = dead
	})
	t.Cleanup(dead.Close)
	a := r.get(t, "/api/v1/consumer/lag")
	require.Equal(t, http.StatusBadGateway, a.code, a.body)
	require.Contains(t, a.body, "group billing")
	require.Equal(t, http.StatusOK, r.get(t, "/console/").code)
}

func TestSubscriptions(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var s console.Subscriptions
	a := r.get(t, "/api/v1/subscriptions")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &s)
	require.Zero(t, s.Head)
	require.Empty(t, s.Subscriptions)

	store, err := events.NewStore(events.StoreConfig{Schema: r.db.Schema})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, r.db.Pool, func(tx pgx.Tx) error {
		for i := range 5 {
			_, err := store.AppendTx(ctx, tx, "order-"+strings.Repeat("x", i+1), events.Any,
				events.EventData{Type: "OrderPlaced", Data: []byte(`{}`)})
			if err != nil {
				return err
			}
		}
		return nil
	}))
	r.exec(t, `INSERT INTO keiro_subscriptions (name, position) VALUES ('billing-projection', 2), ('search', 5)`)
	s = console.Subscriptions{}
	r.get(t, "/api/v1/subscriptions").json(t, &s)
	require.Equal(t, int64(5), s.Head)
	require.Len(t, s.Subscriptions, 2)
	require.Equal(t, "billing-projection", s.Subscriptions[0].Name)
	require.Equal(t, int64(3), s.Subscriptions[0].Distance)
	require.Equal(t, int64(0), s.Subscriptions[1].Distance)
	page := r.get(t, "/console/subscriptions")
	require.Equal(t, http.StatusOK, page.code)
	require.Contains(t, page.body, "billing-projection")
}
