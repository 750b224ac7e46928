package console_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// record is ev as the relay publishes it to topic.
func record(ev envelope.Event, topic string) *kgo.Record {
	kr := ev.Record(envelope.EncodeOptions{})
	out := &kgo.Record{Topic: topic, Key: kr.Key, Value: kr.Value}
	for _, h := range kr.Headers {
		out.Headers = append(out.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	return out
}

// TestDeadLetterTopicListAndReplay runs a real consumer that dead-letters a record whose dedupe
// key it cannot compute and a poisoned one: the console lists both from the dead-letter topic
// with their reasons, newest first and by page; after the fix, the dedupe record is replayed
// from a confirmation page to its source topic (without the keiro-dlq-* headers) and the
// consumer processes it; the poisoned one, which is in the inbox, is refused with the advice
// to retry it there.
func TestDeadLetterTopicListAndReplay(t *testing.T) {
	t.Parallel()
	const topic, dlq = "orders.dl.v1", "orders.dl.v1.dlq"
	r := newRig(t, func(c *console.Config) { c.Inbox.DeadLetterTopics, c.Inbox.Topics = []string{dlq}, []string{topic} })
	r.kc.CreateTopic(t, topic, 1)
	r.kc.CreateTopic(t, dlq, 2)

	var dedupeFixed atomic.Bool
	dead := make(chan string, 8)
	committed := make(chan inbox.Commit, 64)
	cons, err := inbox.NewConsumer(r.db.Pool, inbox.ConsumerConfig{
		Brokers: r.kc.Seeds, Group: consumerName, Topics: []string{topic}, DeadLetterTopic: "{topic}.dlq",
		Store: inbox.StoreConfig{Schema: r.db.Schema, Consumer: consumerName, MaxAttempts: 1,
			DedupePolicy: inbox.DedupeCustom(func(d inbox.Delivery) (string, error) {
				if strings.HasPrefix(d.Event.MessageID, "nokey") && !dedupeFixed.Load() {
					return "", errors.New("no order number in the message")
				}
				return d.Event.MessageID, nil
			})},
		KafkaOpts:      []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
		Logger:         slog.New(slog.DiscardHandler),
		OnDeadLettered: func(_ *kgo.Record, reason string) { dead <- reason },
		OnCommitted:    func(c inbox.Commit) { committed <- c },
	}, r.handle)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	prod := r.kc.NewClient(t)
	require.NoError(t, prod.ProduceSync(context.Background(), record(event("nokey-1", topic, ptr("cust-1"), `{"n":1}`), topic)).FirstErr())
	require.Equal(t, inbox.ReasonDedupe, <-dead)
	require.NoError(t, prod.ProduceSync(context.Background(), record(event("bad-1", topic, ptr("cust-2"), `{"poison":true}`), topic)).FirstErr())
	require.Equal(t, inbox.ReasonPermanent, <-dead)

	// The list: both records, newest first, with the reasons from the headers.
	var page console.DeadLetterPage
	a := r.get(t, "/api/v1/inbox/dead-letters")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &page)
	require.Equal(t, []console.DeadLetterTopic{{Topic: dlq, Records: 2}}, page.Topics)
	require.Len(t, page.Records, 2, a.body)
	require.Empty(t, page.NextCursor)
	poisoned, noKey := page.Records[0], page.Records[1]
	require.Equal(t, "bad-1", poisoned.MessageID, a.body)
	require.Equal(t, inbox.ReasonPermanent, poisoned.Reason)
	require.Equal(t, 1, poisoned.Attempts)
	require.Contains(t, poisoned.Error, "payload is poison")
	require.False(t, poisoned.Replayable)
	require.Contains(t, poisoned.NotReplayable, "retry it from the inbox")
	require.Equal(t, "nokey-1", noKey.MessageID)
	require.Equal(t, inbox.ReasonDedupe, noKey.Reason)
	require.Contains(t, noKey.Error, "no order number")
	require.Equal(t, consumerName, noKey.Consumer)
	require.Equal(t, &console.KafkaPosition{Topic: topic, Partition: 0, Offset: 0}, noKey.Original)
	require.Equal(t, "cust-1", *noKey.Key)
	require.Equal(t, "OrderPlaced", noKey.EventType)
	require.NotNil(t, noKey.DeadLetteredAt)
	require.True(t, noKey.Replayable, noKey.NotReplayable)

	// By pages of one: the same records, then the end.
	a = r.get(t, "/api/v1/inbox/dead-letters?limit=1")
	a.json(t, &page)
	require.Len(t, page.Records, 1)
	require.Equal(t, "bad-1", page.Records[0].MessageID)
	require.NotEmpty(t, page.NextCursor)
	a = r.get(t, "/api/v1/inbox/dead-letters?limit=1&cursor="+url.QueryEscape(page.NextCursor))
	page = console.DeadLetterPage{}
	a.json(t, &page)
	require.Len(t, page.Records, 1, a.body)
	require.Equal(t, "nokey-1", page.Records[0].MessageID)
	require.Empty(t, page.NextCursor)

	// Bad requests and missing records.
	require.Equal(t, http.StatusBadRequest, r.get(t, "/api/v1/inbox/dead-letters?topic="+topic).code)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/api/v1/inbox/dead-letters?cursor=nope").code)
	require.Equal(t, http.StatusNotFound, r.get(t, "/api/v1/inbox/dead-letters/"+dlq+"/0/999").code)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/api/v1/inbox/dead-letters/"+dlq+"/x/0").code)
	a = r.get(t, "/api/v1/inbox/dead-letters/"+noKey.Path())
	require.Equal(t, http.StatusOK, a.code, a.body)
	require.Contains(t, a.body, `"keiro-dlq-reason"`)

	// The pages: the list, the record with its headers.
	list := r.get(t, "/console/dead-letters")
	require.Equal(t, http.StatusOK, list.code, list.body)
	require.Contains(t, list.body, `value="`+noKey.Ref().Value()+`"`)
	require.NotContains(t, list.body, `value="`+poisoned.Ref().Value()+`"`, "a poisoned record is not offered for replay")
	require.Contains(t, list.body, "payload is poison")
	rec := r.get(t, "/console/dead-letters/"+poisoned.Path())
	require.Equal(t, http.StatusOK, rec.code)
	require.Contains(t, rec.body, `id="not-replayable"`)

	// The API refuses a record that is in the inbox, or missing, and says why.
	var ans console.ReplayAnswer
	a = r.postJSON(t, "/api/v1/inbox/dead-letters/replay", console.ReplayRequest{Records: []console.RecordRef{
		poisoned.Ref(), {Topic: dlq, Partition: 1, Offset: 50}, {Topic: topic, Partition: 0, Offset: 0}}})
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &ans)
	require.Empty(t, ans.Replayed)
	require.Len(t, ans.Skipped, 3)
	require.Contains(t, ans.Skipped[0].Reason, "retry it from the inbox")
	require.Contains(t, ans.Skipped[1].Reason, "no record at")
	require.Contains(t, ans.Skipped[2].Reason, "not a dead-letter topic")
	require.Equal(t, http.StatusBadRequest, r.postJSON(t, "/api/v1/inbox/dead-letters/replay", console.ReplayRequest{}).code)

	// A form from another origin is refused before anything is read.
	a = r.do(t, http.MethodPost, "/console/dead-letters/replay", strings.NewReader("csrf_token="+url.QueryEscape(r.csrf(t))+"&record="+url.QueryEscape(noKey.Ref().Value())),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example"})
	require.Equal(t, http.StatusForbidden, a.code)

	// After the fix: the confirmation lists what moves, the confirmed replay answers 303 to
	// the result, and the consumer processes the copy.
	dedupeFixed.Store(true)
	form := "csrf_token=" + url.QueryEscape(r.csrf(t)) + "&record=" + url.QueryEscape(noKey.Ref().Value())
	conf := r.postForm(t, "/console/dead-letters/replay", form)
	require.Equal(t, http.StatusOK, conf.code, conf.body)
	require.Contains(t, conf.body, "Replay 1 of 1 record(s) to "+topic+"?")
	require.Contains(t, conf.body, "OrderPlaced")
	require.Contains(t, conf.body, "cust-1")
	require.Contains(t, conf.body, "no order number")
	res := r.follow(t, r.postForm(t, "/console/dead-letters/replay", form+"&confirm=yes"))
	require.Equal(t, http.StatusOK, res.code, res.body)
	require.Contains(t, res.body, "1 record(s) replayed")
	require.Contains(t, res.body, topic+"/0@2")
	for c := range committed {
		if c.Topic == topic && c.Offset == 3 {
			break
		}
	}
	e, err := inbox.NewAdmin(r.inbox).Lookup(context.Background(), r.db.Pool, inbox.Key{Source: "orders", DedupeKey: "nokey-1"})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusCompleted, e.Status)

	copies := r.kc.Records(t, topic)
	require.Len(t, copies, 3)
	cp := copies[2]
	require.Equal(t, "cust-1", string(cp.Key))
	for _, h := range cp.Headers {
		require.False(t, strings.HasPrefix(h.Key, "keiro-dlq-"), h.Key)
	}
	require.Len(t, cp.Headers, len(record(event("nokey-1", topic, ptr("cust-1"), `{"n":1}`), topic).Headers))
	require.Contains(t, r.logs.String(), "dead-letter replay")
}

// TestDeadLetterTopicNotCreatedYet: before the first dead letter the topic may not exist; the
// list says so instead of failing.
func TestDeadLetterTopicNotCreatedYet(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *console.Config) {
		c.Inbox.DeadLetterTopics, c.Inbox.Topics = []string{"never.dlq"}, []string{"never"}
	})
	var page console.DeadLetterPage
	a := r.get(t, "/api/v1/inbox/dead-letters")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &page)
	require.Len(t, page.Topics, 1)
	require.Contains(t, page.Topics[0].Error, "created by the first dead letter")
	require.Empty(t, page.Records)
	require.Equal(t, http.StatusNotFound, r.get(t, "/api/v1/inbox/dead-letters/never.dlq/0/0").code)
	require.Equal(t, http.StatusOK, r.get(t, "/console/dead-letters").code)
}

// TestDeadLetterReplayOnlyToConsumedTopics: a replay writes a dead letter to the topic its own
// keiro-dlq-topic header names, so a record written to the dead-letter topic by anyone could
// have the console produce to any topic. Only the topics the consumer reads are replay targets:
// another is refused with the reason (in the list, the confirmation and the API), and the
// confirmation names the topic a record goes back to.
func TestDeadLetterReplayOnlyToConsumedTopics(t *testing.T) {
	t.Parallel()
	const topic, dlq, foreign = "orders.only.v1", "orders.only.v1.dlq", "payments.ledger.v1"
	r := newRig(t, func(c *console.Config) {
		c.Inbox.DeadLetterTopics = []string{dlq}
		c.Inbox.Topics = []string{topic}
	})
	r.kc.CreateTopic(t, topic, 1)
	r.kc.CreateTopic(t, dlq, 1)
	r.kc.CreateTopic(t, foreign, 1)
	deadLetter := func(id, to string) *kgo.Record {
		rec := record(event(id, topic, ptr("cust-1"), `{"n":1}`), dlq)
		rec.Headers = append(rec.Headers,
			kgo.RecordHeader{Key: inbox.HeaderDLQReason, Value: []byte(inbox.ReasonDecode)},
			kgo.RecordHeader{Key: inbox.HeaderDLQTopic, Value: []byte(to)},
			kgo.RecordHeader{Key: inbox.HeaderDLQPartition, Value: []byte("0")},
			kgo.RecordHeader{Key: inbox.HeaderDLQOffset, Value: []byte("0")})
		return rec
	}
	prod := r.kc.NewClient(t)
	omitted := deadLetter("omitted-1", topic)
	omitted.Value = nil
	omitted.Headers = append(omitted.Headers, kgo.RecordHeader{Key: inbox.HeaderDLQValueOmitted, Value: []byte("1000000")})
	require.NoError(t, prod.ProduceSync(context.Background(), deadLetter("forged-1", foreign), deadLetter("own-1", topic), omitted).FirstErr())

	var page console.DeadLetterPage
	a := r.get(t, "/api/v1/inbox/dead-letters")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &page)
	require.Len(t, page.Records, 3, a.body)
	byID := map[string]console.DeadLetterRecord{}
	for _, d := range page.Records {
		byID[d.MessageID] = d
	}
	forged, own := byID["forged-1"], byID["own-1"]
	require.False(t, forged.Replayable)
	require.Contains(t, forged.NotReplayable, `"payments.ledger.v1", which is not a topic this consumer reads`)
	require.True(t, own.Replayable, own.NotReplayable)
	// A dead letter written without its value (too large for Kafka) is not replayed empty.
	require.False(t, byID["omitted-1"].Replayable)
	require.Contains(t, byID["omitted-1"].NotReplayable, "carries no value")

	// The confirmation names the target topic, and says why the other is not replayed.
	form := "csrf_token=" + url.QueryEscape(r.csrf(t)) + "&record=" + url.QueryEscape(forged.Ref().Value()) +
		"&record=" + url.QueryEscape(own.Ref().Value())
	conf := r.postForm(t, "/console/dead-letters/replay", form)
	require.Equal(t, http.StatusOK, conf.code, conf.body)
	require.Contains(t, conf.body, "Replay 1 of 2 record(s) to "+topic+"?")
	require.Contains(t, conf.body, "is not a topic this consumer reads")

	var ans console.ReplayAnswer
	a = r.postJSON(t, "/api/v1/inbox/dead-letters/replay", console.ReplayRequest{Records: []console.RecordRef{forged.Ref(), own.Ref()}})
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &ans)
	require.Len(t, ans.Skipped, 1)
	require.Equal(t, forged.Ref(), ans.Skipped[0].Record)
	require.Contains(t, ans.Skipped[0].Reason, "is not a topic this consumer reads")
	require.Len(t, ans.Replayed, 1)
	require.Equal(t, topic, ans.Replayed[0].To.Topic)
	require.Empty(t, r.kc.Records(t, foreign), "nothing was written to the topic the header named")

	// A console that offers replay must know what the consumer reads.
	_, err := console.New(console.Config{Inbox: &console.InboxConfig{Pool: r.db.Pool, Consumer: consumerName,
		Kafka: r.kc.NewClient(t), DeadLetterTopics: []string{dlq}}, Auth: console.AuthConfig{AllowUnauthenticated: true}})
	require.ErrorContains(t, err, "Inbox.DeadLetterTopics needs Inbox.Topics")
}

// TestDeadLetterListReadsBoundedBytes: a page of the dead-letter list over partitions of large
// records reads a bounded number of bytes, not its page size in records from every partition
// (50 records of 1 MB from each of 12 partitions was 600 MB for one page); values are shown
// truncated with their size; the pages, followed by their cursors, still list every record
// once; and reading one record (its page, a replay) reads one record's batch, not the 4 MiB
// after it.
func TestDeadLetterListReadsBoundedBytes(t *testing.T) {
	t.Parallel()
	const dlq, parts, perPart, size = "orders.big.v1.dlq", 4, 10, 900_000
	r := newRig(t, func(c *console.Config) {
		c.Inbox.DeadLetterTopics, c.Inbox.Topics = []string{dlq}, []string{"orders.big.v1"}
	})
	r.kc.CreateTopic(t, dlq, parts)
	var fetched atomic.Int64
	console.SetFetchHook(r.con, func(n int) { fetched.Add(int64(n)) })
	prod := r.kc.NewClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	at := time.Now().Add(-time.Hour)
	for i := range parts * perPart {
		rec := &kgo.Record{Topic: dlq, Partition: int32(i % parts), Key: []byte("k"), Value: incompressible(size),
			Timestamp: at.Add(time.Duration(i) * time.Second),
			Headers:   []kgo.RecordHeader{{Key: inbox.HeaderDLQReason, Value: []byte(inbox.ReasonDecode)}}}
		require.NoError(t, prod.ProduceSync(context.Background(), rec).FirstErr())
	}
	const total = parts * perPart * size
	// A page reads at most the page's byte budget, plus the newest record of each partition
	// (the merge needs every partition's head) and one answer past the budget.
	const bound = console.DeadLetterPageBytes + (parts+1)*(size+1<<10)

	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, parts*perPart, "the pages end")
		fetched.Store(0)
		var page console.DeadLetterPage
		a := r.get(t, "/api/v1/inbox/dead-letters?cursor="+url.QueryEscape(cursor))
		require.Equal(t, http.StatusOK, a.code, a.body)
		a.json(t, &page)
		require.LessOrEqual(t, fetched.Load(), int64(bound), "page %d read %d bytes of %d in the topic", pages, fetched.Load(), total)
		require.NotEmpty(t, page.Records, "every page makes progress")
		var last time.Time
		for i, d := range page.Records {
			require.False(t, seen[d.Path()], "%s listed twice", d.Path())
			seen[d.Path()] = true
			require.Equal(t, size, d.Payload.Size)
			require.True(t, d.Payload.Truncated)
			require.LessOrEqual(t, len(d.Payload.Text), console.DefaultPreviewBytes)
			if i > 0 {
				require.False(t, d.Timestamp.After(last), "newest first within a page")
			}
			last = d.Timestamp
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Len(t, seen, parts*perPart, "every record listed once")

	// One record: one batch read.
	fetched.Store(0)
	a := r.get(t, "/api/v1/inbox/dead-letters/"+dlq+"/1/3")
	require.Equal(t, http.StatusOK, a.code, a.body)
	require.LessOrEqual(t, fetched.Load(), int64(size+1<<10), "reading one record read %d bytes", fetched.Load())
}

// incompressible returns n bytes of random hex text (a compressed batch is as large as it).
func incompressible(n int) []byte {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return []byte(hex.EncodeToString(b))
}
