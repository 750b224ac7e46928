package console_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// deadFixture enqueues rows and moves them to the statuses an operator looks at: two dead
// and a rejected row for "orders.v1", a failed and a sent row, and a dead row for "payments.v1".
func deadFixture(t *testing.T, r *rig) map[string]string {
	t.Helper()
	ids := r.enqueue(t,
		event("d1", "orders.v1", ptr("A"), `{"order":1}`), event("d2", "orders.v1", ptr("B"), `{"order":2}`),
		event("r1", "orders.v1", ptr("C"), `{"order":3}`), event("f1", "orders.v1", ptr("D"), `{"order":4}`),
		event("s1", "orders.v1", ptr("E"), `{"order":5}`), event("p1", "payments.v1", nil, `{"payment":1}`),
		event("q1", "orders.v1", ptr("F"), `{"order":6}`))
	r.exec(t, `
UPDATE keiro_outbox SET status = 'dead', attempt_count = 10, last_error = 'broker unreachable', updated_at = now() WHERE message_id IN ('d1', 'd2', 'p1');
UPDATE keiro_outbox SET status = 'rejected', attempt_count = 1, last_error = 'too big', rejection_code = 'message_too_large', rejected_at = now() WHERE message_id = 'r1';
UPDATE keiro_outbox SET status = 'failed', attempt_count = 2, last_error = 'not leader' WHERE message_id = 'f1';
UPDATE keiro_outbox SET status = 'sent', published_at = now(), kafka_partition = 0, kafka_offset = 7 WHERE message_id = 's1';`)
	return map[string]string{"d1": ids[0], "d2": ids[1], "r1": ids[2], "f1": ids[3], "s1": ids[4], "p1": ids[5], "q1": ids[6]}
}

func TestOutboxSummary(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)

	var empty console.OutboxSummary
	a := r.get(t, "/api/v1/outbox/summary")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &empty)
	require.Empty(t, empty.Destinations)
	require.Zero(t, empty.Backlog)
	require.Nil(t, empty.OldestPendingAgeSeconds)
	require.Len(t, empty.LastHour, 60)

	deadFixture(t, r)
	r.exec(t, `UPDATE keiro_outbox SET created_at = now() - interval '90 seconds' WHERE message_id = 'q1'`)
	var s console.OutboxSummary
	r.get(t, "/api/v1/outbox/summary").json(t, &s)
	require.Len(t, s.Destinations, 2)
	orders := s.Destinations[0]
	require.Equal(t, "orders.v1", orders.Destination)
	require.Equal(t, map[string]int64{"dead": 2, "rejected": 1, "failed": 1, "sent": 1, "pending": 1}, orders.Counts)
	require.Equal(t, int64(2), orders.Backlog)
	require.NotNil(t, orders.OldestPendingAgeSeconds)
	require.GreaterOrEqual(t, *orders.OldestPendingAgeSeconds, 89.0, "q1, pending for 90 s, is the oldest")
	require.Nil(t, s.Destinations[1].OldestPendingAgeSeconds, "payments.v1 has nothing waiting")
	require.Equal(t, int64(2), s.Backlog)
	require.Equal(t, int64(4), s.DeadOrRejected)
	require.Equal(t, int64(1), s.SentLastMinute)
	require.Equal(t, int64(4), s.FailedLastMinute, "three dead and one rejected row changed in the last minute")
	var sent, failed int64
	for _, b := range s.LastHour {
		sent += b.Sent
		failed += b.Failed
	}
	require.Equal(t, int64(1), sent)
	require.Equal(t, int64(4), failed)
	require.Equal(t, int64(1), s.LastHour[58].Sent+s.LastHour[59].Sent, "the newest buckets hold this minute (or the one before, across a minute's end)")
}

// TestRelaysConnected counts the relay processes by their application_name.
func TestRelaysConnected(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var s console.OutboxSummary
	r.get(t, "/api/v1/outbox/summary").json(t, &s)
	require.Zero(t, s.RelaysConnected)
	name := outbox.ApplicationName(r.db.Schema)
	require.True(t, strings.HasPrefix(name, outbox.ApplicationNamePrefix+r.db.Schema+"@"), name)
	require.LessOrEqual(t, len(name), 63)
	pool := openPool(t, r.db.ConnString+"&application_name="+url.QueryEscape(name))
	require.NoError(t, pool.Ping(t.Context()))
	// A relay of another schema on the same database is not counted.
	other := openPool(t, r.db.ConnString+"&application_name="+url.QueryEscape(outbox.ApplicationName("elsewhere")))
	require.NoError(t, other.Ping(t.Context()))
	r.get(t, "/api/v1/outbox/summary").json(t, &s)
	require.Equal(t, int64(1), s.RelaysConnected)
	long := outbox.ApplicationName(strings.Repeat("s", 63))
	require.LessOrEqual(t, len(long), 63, long)
	require.True(t, strings.HasPrefix(long, outbox.ApplicationNamePrefix+strings.Repeat("s", 32)+"@"), long)
}

// logSignal is a slog handler that closes a channel when a record with the given message is
// logged.
type logSignal struct {
	msg  string
	once *sync.Once
	ch   chan struct{}
}

func (h logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h logSignal) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h logSignal) WithGroup(string) slog.Handler            { return h }
func (h logSignal) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message == h.msg {
		h.once.Do(func() { close(h.ch) })
	}
	return nil
}

// TestEmbeddedRelayIsCounted: a relay embedded with outbox.NewRelay on a pool that sets no
// application_name (a service's own pool) is counted as connected once it listens: the relay
// names its own session.
func TestEmbeddedRelayIsCounted(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	listening := logSignal{msg: "outbox listener connected", once: &sync.Once{}, ch: make(chan struct{})}
	relay, err := outbox.NewRelay(r.db.Pool, r.kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{
		Schema: r.db.Schema, PollInterval: time.Hour, Logger: slog.New(listening),
	})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	select {
	case <-listening.ch:
	case err := <-done:
		t.Fatalf("relay stopped before listening: %v", err)
	}
	var s console.OutboxSummary
	r.get(t, "/api/v1/outbox/summary").json(t, &s)
	require.Equal(t, int64(1), s.RelaysConnected, "the embedded relay runs: it is connected")
}

func TestOutboxRowsListing(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)

	var page console.OutboxPage
	a := r.get(t, "/api/v1/outbox/rows")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &page)
	require.Empty(t, page.Rows, "empty state")
	require.Empty(t, page.NextCursor)

	ids := deadFixture(t, r)
	r.get(t, "/api/v1/outbox/rows").json(t, &page)
	var got []string
	for _, row := range page.Rows {
		got = append(got, row.MessageID)
	}
	require.Equal(t, []string{"p1", "r1", "d2", "d1"}, got, "dead and rejected, newest first")
	require.Equal(t, "message_too_large", page.Rows[1].RejectionCode)
	require.Equal(t, ids["p1"], page.Rows[0].OutboxID)
	require.JSONEq(t, `{"payment":1}`, string(page.Rows[0].Payload.JSON))
	require.Contains(t, page.Rows[0].Headers, console.Header{Key: "keiro-message-id", Value: "p1"})

	r.get(t, "/api/v1/outbox/rows?status=failed").json(t, &page)
	require.Len(t, page.Rows, 1)
	require.Equal(t, "f1", page.Rows[0].MessageID)
	require.NotNil(t, page.Rows[0].NextAttemptAt)

	r.get(t, "/api/v1/outbox/rows?status=dead&destination=orders.v1").json(t, &page)
	require.Len(t, page.Rows, 2)
	r.get(t, "/api/v1/outbox/rows?status=dead,rejected&source=nobody").json(t, &page)
	require.Empty(t, page.Rows)

	// Paging: a page of one row at a time walks every row once, newest first.
	var walked []string
	cursor := ""
	for range 10 {
		page = console.OutboxPage{}
		r.get(t, "/api/v1/outbox/rows?limit=1&cursor="+cursor).json(t, &page)
		require.LessOrEqual(t, len(page.Rows), 1)
		for _, row := range page.Rows {
			walked = append(walked, row.MessageID)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	require.Equal(t, []string{"p1", "r1", "d2", "d1"}, walked)

	for _, bad := range []string{"status=sent", "status=bogus", "cursor=abc", "cursor=-3", "limit=0", "limit=x"} {
		a := r.get(t, "/api/v1/outbox/rows?"+bad)
		require.Equal(t, http.StatusBadRequest, a.code, bad)
		var e struct{ Error string }
		a.json(t, &e)
		require.NotEmpty(t, e.Error, bad)
	}
}

// TestOutboxPageSizeBounded: a request never loads more than MaxPageSize rows.
func TestOutboxPageSizeBounded(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	r.exec(t, fmt.Sprintf(`
INSERT INTO keiro_outbox (outbox_id, message_id, source, destination, event_type, schema_version, content_type,
    payload_bytes, occurred_at, status, last_error)
SELECT gen_random_uuid(), 'm-' || i, 'orders', 'orders.v1', 'OrderPlaced', 1, 'application/json', '{}', now(), 'dead', 'x'
FROM generate_series(1, %d) AS i`, console.MaxPageSize+5))
	var page console.OutboxPage
	r.get(t, "/api/v1/outbox/rows?limit=100000").json(t, &page)
	require.Len(t, page.Rows, console.MaxPageSize)
	require.NotEmpty(t, page.NextCursor)
	next := page.NextCursor
	page = console.OutboxPage{}
	r.get(t, "/api/v1/outbox/rows?limit=100000&cursor="+next).json(t, &page)
	require.Len(t, page.Rows, 5)
	require.Empty(t, page.NextCursor)
	r.get(t, "/api/v1/outbox/rows").json(t, &page)
	require.Len(t, page.Rows, console.DefaultPageSize)
}

func TestOutboxRowDetail(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := deadFixture(t, r)
	var row console.OutboxRow
	a := r.get(t, "/api/v1/outbox/rows/"+ids["s1"])
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &row)
	require.Equal(t, "sent", row.Status)
	require.Equal(t, int64(7), *row.Offset)
	require.JSONEq(t, `{"order":5}`, string(row.Payload.JSON))
	require.Equal(t, "keiro-message-id", row.Headers[0].Key)

	a = r.get(t, "/api/v1/outbox/rows/not-a-uuid")
	require.Equal(t, http.StatusBadRequest, a.code)
	require.Contains(t, a.body, "not a UUID")
	a = r.get(t, "/api/v1/outbox/rows/00000000-0000-0000-0000-000000000000")
	require.Equal(t, http.StatusNotFound, a.code)
	require.Contains(t, a.body, "not found")
}

// TestOutboxHugePayload: a list carries a capped preview, the detail a capped payload, both
// saying the full size.
func TestOutboxHugePayload(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	big := `{"blob":"` + strings.Repeat("x", 3<<20) + `"}`
	binary := string(bytes.Repeat([]byte{0, 0xff, 0x10}, 1000))
	ev := event("huge", "orders.v1", ptr("A"), big)
	bin := event("bin", "orders.v1", ptr("B"), binary)
	bin.ContentType = "application/vnd.apache.avro+binary"
	ids := r.enqueue(t, ev, bin)
	r.exec(t, `UPDATE keiro_outbox SET status = 'dead', last_error = 'too slow' WHERE message_id IN ('huge', 'bin')`)

	var page console.OutboxPage
	r.get(t, "/api/v1/outbox/rows").json(t, &page)
	require.Len(t, page.Rows, 2)
	p := page.Rows[1].Payload
	require.True(t, p.Truncated)
	require.Equal(t, len(big), p.Size)
	require.Len(t, p.Text, console.DefaultPreviewBytes)
	require.Nil(t, p.JSON)
	require.NotEmpty(t, page.Rows[0].Payload.Base64, "binary payloads travel as base64")

	var row console.OutboxRow
	a := r.get(t, "/api/v1/outbox/rows/"+ids[0])
	require.Less(t, len(a.body), console.DefaultDetailPayloadBytes*2)
	a.json(t, &row)
	require.True(t, row.Payload.Truncated)
	require.Len(t, row.Payload.Text, console.DefaultDetailPayloadBytes)

	page2 := r.get(t, "/console/outbox/"+ids[0])
	require.Equal(t, http.StatusOK, page2.code)
	require.Contains(t, page2.body, "first part shown")
	require.Less(t, len(page2.body), 2*console.DefaultDetailPayloadBytes)
	require.Contains(t, r.get(t, "/console/outbox/"+ids[1]).body, "binary")
}

func TestOutboxRequeueAPI(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := deadFixture(t, r)

	var ans console.RequeueAnswer
	a := r.postJSON(t, "/api/v1/outbox/requeue", console.RequeueRequest{
		IDs: []string{ids["d1"], ids["f1"], "00000000-0000-0000-0000-000000000001"}})
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &ans)
	require.Equal(t, []string{ids["d1"]}, ans.Requeued)
	require.Equal(t, 1, ans.Count)
	require.ElementsMatch(t, []console.SkippedRow{{ID: ids["f1"], Reason: "failed"},
		{ID: "00000000-0000-0000-0000-000000000001", Reason: "no such row"}}, ans.Skipped)
	require.Contains(t, ans.Warning, "AFTER later events of its key")
	var row console.OutboxRow
	r.get(t, "/api/v1/outbox/rows/"+ids["d1"]).json(t, &row)
	require.Equal(t, "pending", row.Status)
	require.Zero(t, row.Attempts, "a fresh attempt budget")
	require.Contains(t, r.logs.String(), "console: outbox requeue")
	require.Contains(t, r.logs.String(), "who=anonymous")

	// A filter moves every dead or rejected row of the destination, and nothing else.
	a = r.postJSON(t, "/api/v1/outbox/requeue", console.RequeueRequest{Destination: "orders.v1"})
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &ans)
	require.ElementsMatch(t, []string{ids["d2"], ids["r1"]}, ans.Requeued)
	r.get(t, "/api/v1/outbox/rows/"+ids["p1"]).json(t, &row)
	require.Equal(t, "dead", row.Status)

	a = r.postJSON(t, "/api/v1/outbox/requeue", console.RequeueRequest{All: true})
	a.json(t, &ans)
	require.Equal(t, []string{ids["p1"]}, ans.Requeued)

	for name, bad := range map[string]any{
		"empty":     console.RequeueRequest{},
		"mixed":     console.RequeueRequest{IDs: []string{ids["d1"]}, All: true},
		"bad id":    console.RequeueRequest{IDs: []string{"nope"}},
		"too many":  console.RequeueRequest{IDs: make([]string, console.MaxSelection+1)},
		"unknown":   map[string]any{"idz": []string{ids["d1"]}},
		"not json":  "requeue please",
		"wrong all": map[string]any{"all": "yes"},
	} {
		a := r.postJSON(t, "/api/v1/outbox/requeue", bad)
		require.Equal(t, http.StatusBadRequest, a.code, name+": "+a.body)
	}
	huge := `{"ids":["` + strings.Repeat("a", console.MaxRequestBytes) + `"]}`
	a = r.do(t, http.MethodPost, "/api/v1/outbox/requeue", strings.NewReader(huge),
		map[string]string{"Content-Type": "application/json", "X-CSRF-Token": r.csrf(t)})
	require.Equal(t, http.StatusRequestEntityTooLarge, a.code, a.body)
}

// Archived rows leave the summary's counts (an operator set them aside: nothing to do) and are
// counted on their own, on the overview too.
func TestOutboxSummaryCountsArchivedRowsApart(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := deadFixture(t, r)
	a := r.postJSON(t, "/api/v1/outbox/archive", console.OutboxArchiveRequest{IDs: []string{ids["d1"], ids["r1"]}})
	require.Equal(t, http.StatusOK, a.code, a.body)
	var ans console.ArchiveAnswer
	a.json(t, &ans)
	require.Equal(t, 2, ans.Archived)

	var s console.OutboxSummary
	r.get(t, "/api/v1/outbox/summary").json(t, &s)
	require.Equal(t, int64(2), s.DeadOrRejected, "d2 and p1 still wait for an operator")
	require.Equal(t, int64(2), s.Archived)
	require.Equal(t, map[string]int64{"dead": 1, "failed": 1, "sent": 1, "pending": 1}, s.Destinations[0].Counts)
	require.Equal(t, int64(2), s.Totals["dead"])
	require.Zero(t, s.Totals["rejected"])
	page := r.get(t, "/console/")
	require.Equal(t, http.StatusOK, page.code)
	require.Contains(t, page.body, `id="archived-count">2 archived</a>`)
}

// In log mode the summary and the overview show the replication slot: its reader, the WAL it
// retains and its wal_status (the WAL guard).
func TestOutboxSummaryLogSlot(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx := t.Context()
	var s console.OutboxSummary
	r.get(t, "/api/v1/outbox/summary").json(t, &s)
	require.Equal(t, "claim", s.Mode)
	require.Nil(t, s.LogSlot, "no slot in claim mode")

	slot := outbox.DefaultLogSlot(r.db.Schema)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = r.db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		_, _ = r.db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+slot)
	})
	admin, err := outbox.NewAdmin(r.db.Schema)
	require.NoError(t, err)
	_, err = admin.SetMode(ctx, r.db.Pool, outbox.ModeLog, "")
	require.NoError(t, err)
	r.get(t, "/api/v1/outbox/summary").json(t, &s)
	require.Equal(t, "log", s.Mode)
	require.NotNil(t, s.LogSlot)
	require.Equal(t, slot, s.LogSlot.Slot)
	require.Zero(t, s.LogSlot.ActivePID, "no relay reads it")
	require.Contains(t, []string{"reserved", "extended"}, s.LogSlot.WALStatus)
	require.NotEmpty(t, s.LogSlot.ConfirmedFlushLSN)
	require.Len(t, s.LogSlots, 1, "every slot of the schema")
	require.Equal(t, slot, s.LogSlots[0].Slot)
	require.Empty(t, s.LogSlots[0].Destinations, "the default slot publishes every destination")

	home := r.get(t, "/console/").body
	require.Contains(t, home, `id="log-slot"`)
	require.Contains(t, home, "Log slot "+slot)
	require.Contains(t, home, "no reader")
	require.Contains(t, home, s.LogSlot.WALStatus)
	require.Contains(t, home, "publishes every destination")
}

// A console in an exactly-once relay's process shows the relay's transactional id and its
// transactions.
func TestOutboxSummaryExactlyOnce(t *testing.T) {
	t.Parallel()
	var relay *outbox.Relay
	r := newRig(t, func(c *console.Config) {
		c.Outbox.ExactlyOnce = func() (outbox.ExactlyOnceStatus, bool) { return relay.ExactlyOnce() }
	})
	topic := r.kc.Topic("orders")
	r.kc.CreateTopic(t, topic, 1)
	var err error
	relay, err = outbox.NewRelay(r.db.Pool, r.kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{
		Schema: r.db.Schema, ExactlyOnce: true, InstanceID: "console-test", OffsetsTopic: r.kc.Topic("offsets"),
	})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	r.enqueue(t, envelope.Event{MessageID: "eos-1", Source: "orders", Destination: topic, EventType: "placed",
		ContentType: "application/json", OccurredAt: time.Now(), Payload: []byte(`{}`)})
	testenv.WaitFor(t, 30*time.Second, "a committed transaction", func() bool {
		st, _ := relay.ExactlyOnce()
		return st.Committed > 0
	})
	var s console.OutboxSummary
	r.get(t, "/api/v1/outbox/summary").json(t, &s)
	require.NotNil(t, s.ExactlyOnce)
	require.Equal(t, "keiro-relay-claim."+r.db.Schema+".console-test", s.ExactlyOnce.TransactionalID)
	require.Positive(t, s.ExactlyOnce.Committed)
	home := r.get(t, "/console/").body
	require.Contains(t, home, `id="exactly-once"`)
	require.Contains(t, home, "keiro-relay-claim."+r.db.Schema+".console-test")
}
