package keirotest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest"
)

// exactlyOnceSetup is the broker and events of the RequireExactlyOnce tests: events m0..m5 on
// keys a and b (m0, m2, m4 on a; m1, m3, m5 on b) for topic.
type exactlyOnceSetup struct {
	kafka *keirotest.Kafka
	topic string
	evs   []envelope.Event
	ids   []string
}

func setupExactlyOnce(t *testing.T) *exactlyOnceSetup {
	t.Helper()
	return setupExactlyOnceOn(t, keirotest.NewKafka(t))
}

// setupExactlyOnceOn is setupExactlyOnce on kafka.
func setupExactlyOnceOn(t *testing.T, kafka *keirotest.Kafka) *exactlyOnceSetup {
	t.Helper()
	s := &exactlyOnceSetup{kafka: kafka, topic: kafka.Topic("billing.invoices.v1")}
	kafka.CreateTopic(t, s.topic, 1)
	for i := range 6 {
		ev := keirotest.JSONEvent(t, "InvoiceIssued", map[string]int{"n": i})
		ev.MessageID = fmt.Sprintf("m%d", i)
		ev.Destination = s.topic
		key := []string{"a", "b"}[i%2]
		ev.Key = &key
		s.evs = append(s.evs, ev)
		s.ids = append(s.ids, ev.MessageID)
	}
	return s
}

// produce writes the events at indexes idx, in that order, outside any transaction.
func (s *exactlyOnceSetup) produce(t *testing.T, idx ...int) {
	t.Helper()
	for _, i := range idx {
		keirotest.Produce(t, s.kafka, s.evs[i])
	}
}

// produceTx writes the events at indexes idx in one transaction of producer txID, committed
// or aborted.
func (s *exactlyOnceSetup) produceTx(t *testing.T, txID string, commit bool, idx ...int) {
	t.Helper()
	cl := s.kafka.NewClient(t, kgo.TransactionalID(s.kafka.Group(txID)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, i := range idx {
		r := s.evs[i].Record(envelope.EncodeOptions{})
		rec := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

func TestRequireExactlyOncePasses(t *testing.T) {
	t.Parallel()
	keirotest.EachKafka(t, keirotest.KafkaConfig{}, testRequireExactlyOncePasses)
}

func testRequireExactlyOncePasses(t *testing.T, kafka *keirotest.Kafka) {
	s := setupExactlyOnceOn(t, kafka)
	s.produce(t, 0, 1, 2)
	s.produceTx(t, "aborted", false, 3, 4, 5, 3) // an aborted transaction's copies never count
	s.produceTx(t, "committed", true, 3, 4)
	s.produceTx(t, "aborted", false, 5) // the topic ends with an abort marker
	s.produce(t, 5)

	recs := keirotest.RequireExactlyOnce(t, s.kafka, s.topic, keirotest.ExactlyOnce{MessageIDs: s.ids})
	if len(recs) != 6 {
		t.Fatalf("want the 6 committed records, got %d", len(recs))
	}
	c := keirotest.CommittedRecords(t, s.kafka, s.topic)
	if c.Aborted != 5 || c.Open != 0 || len(c.Records) != 6 {
		t.Fatalf("want 6 committed records, 5 aborted and 0 open, got %d, %d and %d", len(c.Records), c.Aborted, c.Open)
	}
}

func TestRequireExactlyOnceWaitsWithin(t *testing.T) {
	t.Parallel()
	s := setupExactlyOnce(t)
	s.produce(t, 0, 1, 2)
	go func() { // a component publishing in the background, while the assertion reads
		for _, ev := range s.evs[3:] {
			r := ev.Record(envelope.EncodeOptions{})
			rec := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value}
			for _, h := range r.Headers {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
			}
			_ = s.kafka.Client.ProduceSync(context.Background(), rec).FirstErr()
		}
	}()
	keirotest.RequireExactlyOnce(t, s.kafka, s.topic, keirotest.ExactlyOnce{MessageIDs: s.ids, Within: 30 * time.Second})
}

func TestRequireExactlyOnceReportsDuplicates(t *testing.T) {
	t.Parallel()
	s := setupExactlyOnce(t)
	s.produce(t, 0, 1, 2, 3, 4, 5, 2)
	r := record(t, func(tb testing.TB) {
		keirotest.RequireExactlyOnce(tb, s.kafka, s.topic, keirotest.ExactlyOnce{MessageIDs: s.ids})
	})
	requireFailure(t, r, `topic "billing.invoices.v1" does not hold each of 6 message ids exactly once in key order`,
		"left out: 0 records of aborted transactions, 0 records of open ones",
		"duplicated: 1 message id", `"m2" 2 times: partition 0 offset 2, partition 0 offset 6`)
}

func TestRequireExactlyOnceAllowDuplicates(t *testing.T) {
	t.Parallel()
	s := setupExactlyOnce(t)
	s.produce(t, 0, 1, 2, 3, 2, 4, 5) // a relay's repeat of m2 after m3: the first copies are in order
	keirotest.RequireExactlyOnce(t, s.kafka, s.topic, keirotest.ExactlyOnce{MessageIDs: s.ids, AllowDuplicates: true})

	s2 := setupExactlyOnce(t)
	s2.produce(t, 0, 1, 2, 3, 2, 5)
	r := record(t, func(tb testing.TB) {
		keirotest.RequireExactlyOnce(tb, s2.kafka, s2.topic, keirotest.ExactlyOnce{MessageIDs: s2.ids, AllowDuplicates: true})
	})
	requireFailure(t, r, "does not hold each of 6 message ids at least once in key order", "missing: 1 of 6 message ids", `"m4"`)
	if strings.Contains(r.message(), "duplicated") {
		t.Fatalf("copies are allowed; the message reports them:\n%s", r.message())
	}
}

func TestRequireExactlyOnceReportsMissingAndUnexpected(t *testing.T) {
	t.Parallel()
	s := setupExactlyOnce(t)
	s.produce(t, 0, 1, 2, 4, 5)
	s.produceTx(t, "aborted", false, 3) // aborted: still missing
	extra := keirotest.JSONEvent(t, "InvoiceIssued", nil)
	extra.MessageID, extra.Destination = "stray", s.topic
	keirotest.Produce(t, s.kafka, extra)
	r := record(t, func(tb testing.TB) {
		keirotest.RequireExactlyOnce(tb, s.kafka, s.topic, keirotest.ExactlyOnce{MessageIDs: s.ids})
	})
	requireFailure(t, r, "left out: 1 record of aborted transactions", "missing: 1 of 6 message ids", `"m3"`,
		"unexpected: 1 record", `id "stray" not wanted`)
}

func TestRequireExactlyOnceReportsOrderBreaks(t *testing.T) {
	t.Parallel()
	s := setupExactlyOnce(t)
	s.produce(t, 0, 1, 4, 3, 2, 5) // key a: m0 m4 m2
	r := record(t, func(tb testing.TB) {
		keirotest.RequireExactlyOnce(tb, s.kafka, s.topic, keirotest.ExactlyOnce{MessageIDs: s.ids})
	})
	t.Log(r.message())
	requireFailure(t, r, "out of key order: 1 record",
		`key "a": "m2" (partition 0 offset 4) comes after "m4" (partition 0 offset 2); want lists "m2" first`)
	if msg := r.message(); strings.Contains(msg, "duplicated") || strings.Contains(msg, "missing") {
		t.Fatalf("only the order is wrong; the message says more:\n%s", msg)
	}
}

func TestRequireExactlyOnceWithID(t *testing.T) {
	t.Parallel()
	s := setupExactlyOnce(t)
	s.produce(t, 0, 1, 2, 3, 4, 5)
	byPayload := func(r keirotest.Record) string { return string(r.Event.Payload) }
	want := []string{`{"n":0}`, `{"n":1}`, `{"n":2}`, `{"n":3}`, `{"n":4}`, `{"n":5}`}
	keirotest.RequireExactlyOnce(t, s.kafka, s.topic, keirotest.ExactlyOnce{MessageIDs: want, ID: byPayload})
}

func TestRequireExactlyOnceCountsOpenTransactions(t *testing.T) {
	t.Parallel()
	s := setupExactlyOnce(t)
	s.produce(t, 0, 1, 2)
	cl := s.kafka.NewClient(t, kgo.TransactionalID("open"))
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	r := s.evs[3].Record(envelope.EncodeOptions{})
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s.produce(t, 4, 5) // committed after the open transaction began: counted
	c := keirotest.CommittedRecords(t, s.kafka, s.topic)
	if len(c.Records) != 5 || c.Open != 1 {
		t.Fatalf("want 5 committed records and 1 open, got %d and %d", len(c.Records), c.Open)
	}
	if err := cl.EndTransaction(context.Background(), kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
}

// Records reads a topic that ends with a transaction marker (a control record, which occupies
// an offset but is never handed to a consumer) up to its end without waiting for a record that
// never comes.
func TestRecordsOfATopicEndingWithATransactionMarker(t *testing.T) {
	t.Parallel()
	s := setupExactlyOnce(t)
	s.produce(t, 0)
	s.produceTx(t, "committed", true, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	recs, err := s.kafka.ReadTopic(ctx, s.topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || string(recs[1].Key) != "b" {
		t.Fatalf("want the 2 records, got %d", len(recs))
	}
}
