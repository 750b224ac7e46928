package inbox_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// failProduces makes the broker refuse every produce request from now on (requests name topics
// by id in recent versions, so the hook cannot pick by name); it returns the number of
// requests refused so far.
func failProduces(kc *testenv.Kafka) *atomic.Int64 {
	var refused atomic.Int64
	kc.Cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		refused.Add(1)
		return testenv.ProduceError(req, kerr.TopicAuthorizationFailed.Code), nil, true
	})
	return &refused
}

// TestConsumerStoppedWhileDeadLetteringCommitsOnlyWhatRan: in batch mode, a good record is
// followed by an undecodable one whose dead-letter produce keeps failing. When the consumer is
// stopped meanwhile, the committed offset must not pass a record whose effects did not run:
// the good record is processed before the bad one is dead-lettered (in offset order), and the
// bad one is not committed.
func TestConsumerStoppedWhileDeadLetteringCommitsOnlyWhatRan(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.stuck-dlq.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	prod := kc.NewClient(t)
	good := newEvent("ordering", topic)
	produceEvents(t, prod, good)
	produce(t, prod, &kgo.Record{Topic: topic, Value: []byte("garbage, no headers")})
	refused := failProduces(kc) // the consumer's dead-letter produces

	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: 2,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}, fx.handler())
	deadline := time.Now().Add(30 * time.Second)
	for refused.Load() < 2 {
		require.True(t, time.Now().Before(deadline), "the dead-letter produce was never tried")
		time.Sleep(10 * time.Millisecond)
	}
	r.stop(t)

	require.Equal(t, 1, fx.count(t, good.MessageID), "the good record ran")
	require.EqualValues(t, 1, p.total(topic), "committed up to the good record, not past the bad one")
	require.Zero(t, r.c.Stats().DeadLettered)
}

// TestConsumerUnstorableRecordsAreDeadLettered: records whose content PostgreSQL refuses in the
// inbox row (\u0000 in the attributes' JSON, a message id too long for the dedupe index) are
// dead-lettered as "unstorable" instead of being retried forever as a database outage, and the
// partition moves on; a binary Kafka key is stored (as hex) and the record processed. In batch
// mode the batch falls back to one record at a time, so only the bad records go.
func TestConsumerUnstorableRecordsAreDeadLettered(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDB(t)
			fx := newEffects(t, db)
			kc := testenv.NewKafka(t)
			const topic = "billing.unstorable.v1"
			kc.CreateTopic(t, topic, 1)
			kc.CreateTopic(t, topic+".dlq", 1)
			binaryKey := newEvent("ordering", topic)
			k := string([]byte{0, 0, 0, 0, 7}) // a Confluent-framed key: magic byte 0, schema id 7
			binaryKey.Key = &k
			nulJSON := newEvent("ordering", topic)
			nulJSON.Attributes = []byte(`{"note":"\u0000"}`)
			longID := newEvent("ordering", topic)
			noise := make([]byte, 4500) // incompressible, so the index cannot compress it under its limit
			_, _ = rand.Read(noise)
			longID.MessageID = "m-" + base64.RawURLEncoding.EncodeToString(noise)
			last := newEvent("ordering", topic)
			produceEvents(t, kc.NewClient(t), binaryKey, nulJSON, longID, last)

			h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
				ev.Key = nil // the effects table stores keys as text
				return fx.handler()(ctx, tx, ev)
			}
			p := newProgress()
			r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
				Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: batch,
				Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
			}, h)
			p.waitCommitted(t, topic, 4, 30*time.Second)
			r.stop(t)

			require.Equal(t, 1, fx.count(t, binaryKey.MessageID))
			require.Equal(t, 1, fx.count(t, last.MessageID))
			require.Equal(t, 2, fx.count(t, ""), "only the storable records ran")
			require.Zero(t, r.c.Stats().StorageErrors, "not an outage")
			var stored string
			require.NoError(t, db.Pool.QueryRow(context.Background(),
				"SELECT message_key FROM keiro_inbox WHERE message_id = $1", binaryKey.MessageID).Scan(&stored))
			require.Equal(t, `\x0000000007`, stored)
			dlq := dlqRecords(t, kc, topic+".dlq", 2)
			for _, id := range []string{nulJSON.MessageID, longID.MessageID} {
				require.Equal(t, inbox.ReasonUnstorable, header(dlq[id], inbox.HeaderDLQReason), id[:min(len(id), 20)])
			}
		})
	}
}

// TestConsumerRedeliveredDeadLetterIsADuplicate: a poison message produced twice (a relay's
// at-least-once duplicate) is dead-lettered once; the second copy finds its row poisoned and
// dead-lettered and counts as a duplicate. A message poisoned by an earlier run that stopped
// before its dead-letter produce was acknowledged is still dead-lettered by its next delivery.
func TestConsumerRedeliveredDeadLetterIsADuplicate(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDB(t)
			fx := newEffects(t, db)
			kc := testenv.NewKafka(t)
			const topic = "billing.redelivered-poison.v1"
			kc.CreateTopic(t, topic, 1)
			kc.CreateTopic(t, topic+".dlq", 1)
			poison, earlier, good := newEvent("ordering", topic), newEvent("ordering", topic), newEvent("ordering", topic)
			// earlier was poisoned by a run that stopped before dead-lettering it.
			s := newStore(t, db, func(c *inbox.StoreConfig) { c.MaxAttempts = 1 })
			res, err := s.Process(context.Background(), db.Pool, inbox.Delivery{Event: earlier},
				func(context.Context, pgx.Tx, envelope.Event) error {
					return inbox.Permanent(fmt.Errorf("unprocessable"))
				})
			require.NoError(t, err)
			require.Equal(t, inbox.Poisoned, res.Outcome)
			produceEvents(t, kc.NewClient(t), poison, earlier, poison, good, poison)

			h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
				if ev.MessageID == poison.MessageID {
					return inbox.Permanent(fmt.Errorf("HTTP 422"))
				}
				return fx.handler()(ctx, tx, ev)
			}
			p := newProgress()
			r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
				Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: batch,
				Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
			}, h)
			p.waitCommitted(t, topic, 5, 30*time.Second)
			r.stop(t)

			st := r.c.Stats()
			require.EqualValues(t, 2, st.DeadLettered, "poison once, earlier once")
			require.EqualValues(t, 2, st.Duplicates, "the two redeliveries of the dead-lettered poison")
			require.Equal(t, 1, fx.count(t, good.MessageID))
			dlq := dlqRecords(t, kc, topic+".dlq", 2)
			require.Equal(t, inbox.ReasonPermanent, header(dlq[poison.MessageID], inbox.HeaderDLQReason))
			require.Equal(t, inbox.ReasonPoisoned, header(dlq[earlier.MessageID], inbox.HeaderDLQReason))

			// An operator's reset clears the mark: the next delivery runs (and dead-letters) again.
			n, err := inbox.NewAdmin(r.c.Store()).RetryFailed(context.Background(), db.Pool, inbox.RetryFilter{All: true})
			require.NoError(t, err)
			require.EqualValues(t, 2, n)
			var marked int
			require.NoError(t, db.Pool.QueryRow(context.Background(),
				`SELECT count(*) FROM keiro_inbox WHERE dead_lettered_at IS NOT NULL`).Scan(&marked))
			require.Zero(t, marked)
		})
	}
}

// TestNewConsumerRejectsInvalidDeadLetterTopic: a dead-letter topic that Kafka would refuse is
// a configuration error naming DeadLetterTopic (with it, the first poisoned record's produce
// would be retried forever, holding up its partition); legal ones are accepted.
func TestNewConsumerRejectsInvalidDeadLetterTopic(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	handler := func(context.Context, pgx.Tx, envelope.Event) error { return nil }
	newConsumer := func(dlq string, regex bool, topics ...string) error {
		_, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
			Brokers: []string{"127.0.0.1:9092"}, Group: "billing", Topics: topics, TopicsRegex: regex,
			DeadLetterTopic: dlq, Store: inbox.StoreConfig{Schema: db.Schema},
		}, handler)
		return err
	}
	for _, tc := range []struct {
		dlq    string
		regex  bool
		topics []string
		want   string
	}{
		{"orders dlq", false, []string{"orders.v1"}, `DeadLetterTopic: topic "orders dlq" is not a legal Kafka topic (byte 6 ' '`},
		{"{topic}!", false, []string{"orders.v1", "invoices.v1"}, `DeadLetterTopic: gives "invoices.v1!" for topic "invoices.v1", which is not a legal Kafka topic`},
		{"{topic}.{partition}", false, []string{"orders.v1"}, `DeadLetterTopic: "{topic}.{partition}" has a placeholder other than {topic}`},
		{"orders.v1", false, []string{"orders.v1"}, `DeadLetterTopic: "orders.v1" is also consumed`},
		{"{topic}", false, []string{"orders.v1"}, `DeadLetterTopic: gives "orders.v1" for topic "orders.v1", which is also consumed`},
		{strings.Repeat("d", 250) + "{topic}", false, []string{"orders.v1"}, "longer than Kafka's 249"},
		{"{topic}/dlq", true, []string{"orders\\..*"}, `DeadLetterTopic: "{topic}/dlq" is not a legal Kafka topic for any topic`},
	} {
		err := newConsumer(tc.dlq, tc.regex, tc.topics...)
		require.ErrorContains(t, err, tc.want, "DeadLetterTopic %q", tc.dlq)
	}
	for _, ok := range []string{"", inbox.DefaultDeadLetterTopic, "billing.dead-letters", "dlq_{topic}"} {
		require.NoError(t, newConsumer(ok, false, "orders.v1", "invoices.v1"), "DeadLetterTopic %q", ok)
	}
	require.NoError(t, newConsumer("{topic}.dlq", true, "orders\\..*"))
}
