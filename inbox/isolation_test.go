package inbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// produceInTransaction writes evs in one Kafka transaction of a transactional producer with
// id txID, and commits it or, with abort, aborts it.
func produceInTransaction(t testing.TB, kc *testenv.Kafka, txID string, abort bool, evs ...envelope.Event) {
	t.Helper()
	cl := kc.NewClient(t, kgo.TransactionalID(txID))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.BeginTransaction())
	recs := make([]*kgo.Record, len(evs))
	for i := range evs {
		recs[i] = toKgo(evs[i].Record(envelope.EncodeOptions{}))
	}
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
	require.NoError(t, cl.EndTransaction(ctx, kgo.TransactionEndTry(!abort)))
}

func TestConsumerIsolationLevel(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, testConsumerIsolationLevel)
}

func testConsumerIsolationLevel(t *testing.T, kc *testenv.Kafka) {
	topic := kc.Topic("billing.isolation.v1")
	kc.CreateTopic(t, topic, 1) // one partition: the committed record comes after the aborted ones
	aborted := keyedEvents("ordering", topic, 5, 2)
	committed := keyedEvents("ordering", topic, 3, 2)
	produceInTransaction(t, kc, kc.Group("tx-aborted"), true, aborted...)
	produceInTransaction(t, kc, kc.Group("tx-committed"), false, committed...)
	last := committed[len(committed)-1].MessageID

	// consume runs a consumer at level until its handler has processed the last committed
	// event, and returns the message ids the handler was given, in order.
	consume := func(t *testing.T, level inbox.IsolationLevel) []string {
		db := testenv.NewDB(t)
		var mu sync.Mutex
		var seen []string
		done := make(chan struct{})
		r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
			Brokers: kc.Seeds, Group: kc.Group("billing-" + level.String()), Topics: []string{topic},
			Store: inbox.StoreConfig{Schema: db.Schema}, IsolationLevel: level,
		}, func(_ context.Context, _ pgx.Tx, ev envelope.Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, ev.MessageID)
			if ev.MessageID == last {
				close(done)
			}
			return nil
		})
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("the handler was not given the last committed event within 30s")
		}
		r.stop(t)
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
	ids := func(evs ...[]envelope.Event) []string {
		var out []string
		for _, es := range evs {
			for _, ev := range es {
				out = append(out, ev.MessageID)
			}
		}
		return out
	}

	t.Run("read_committed", func(t *testing.T) {
		require.Equal(t, ids(committed), consume(t, inbox.ReadCommitted),
			"the default level hands over the committed events alone")
	})
	t.Run("read_uncommitted", func(t *testing.T) {
		require.Equal(t, ids(aborted, committed), consume(t, inbox.ReadUncommitted),
			"read_uncommitted hands over the aborted events too")
	})
}

func TestIsolationLevelParse(t *testing.T) {
	for _, l := range []inbox.IsolationLevel{inbox.ReadCommitted, inbox.ReadUncommitted} {
		got, err := inbox.ParseIsolationLevel(l.String())
		require.NoError(t, err)
		require.Equal(t, l, got)
	}
	var zero inbox.IsolationLevel
	require.Equal(t, inbox.ReadCommitted, zero, "the zero value is read_committed")
	_, err := inbox.ParseIsolationLevel("serializable")
	require.ErrorContains(t, err, "use read_committed or read_uncommitted")
	_, err = inbox.NewConsumer(nil, inbox.ConsumerConfig{IsolationLevel: 7}, nil)
	require.ErrorContains(t, err, "IsolationLevel: unknown level 7")
}

// TestConsumerCommitsPastTransactionMarkers: a partition written in Kafka transactions ends
// with the last transaction's commit marker, an offset no handler sees. The consumer commits
// past it, so the group's committed offset reaches the partition's end and its lag reads 0 —
// not 1 forever, as it does for a consumer that commits the offset after its last record.
func TestConsumerCommitsPastTransactionMarkers(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, kc *testenv.Kafka) {
		topic := kc.Topic("billing.markers.v1")
		kc.CreateTopic(t, topic, 1)
		first := keyedEvents("ordering", topic, 3, 1)
		second := keyedEvents("ordering", topic, 2, 1)
		for i := range second {
			second[i].MessageID += "-second"
		}
		produceInTransaction(t, kc, kc.Group("tx-markers"), false, first...)
		produceInTransaction(t, kc, kc.Group("tx-markers"), true, keyedEvents("ordering", topic, 1, 1)...) // aborted: its marker too
		produceInTransaction(t, kc, kc.Group("tx-markers"), false, second...)

		// The partition's end: 3 + 1 + 2 records and three markers.
		adm := kadm.NewClient(kc.NewClient(t))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ends, err := adm.ListEndOffsets(ctx, topic)
		require.NoError(t, err)
		end, ok := ends.Lookup(topic, 0)
		require.True(t, ok)
		require.NoError(t, end.Err)
		require.EqualValues(t, 9, end.Offset)

		db := testenv.NewDB(t)
		group := kc.Group("billing-markers")
		commits := make(chan inbox.Commit, 64)
		var handled []string
		var mu sync.Mutex
		r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
			Brokers: kc.Seeds, Group: group, Topics: []string{topic},
			Store:       inbox.StoreConfig{Schema: db.Schema},
			OnCommitted: func(c inbox.Commit) { commits <- c },
		}, func(_ context.Context, _ pgx.Tx, ev envelope.Event) error {
			mu.Lock()
			defer mu.Unlock()
			handled = append(handled, ev.MessageID)
			return nil
		})
		records := 0
		for reached := false; !reached; {
			select {
			case c := <-commits:
				records += c.Records
				reached = c.Offset == end.Offset
				require.LessOrEqual(t, c.Offset, end.Offset)
			case <-time.After(30 * time.Second):
				t.Fatalf("no offset commit reached the partition's end (%d) within 30s", end.Offset)
			}
		}
		require.Equal(t, 5, records, "the commits cover the five committed records; markers count for none")
		lag, err := inbox.GroupLag(ctx, kc.NewClient(t), group)
		require.NoError(t, err)
		l, ok := lag.Lag.Lookup(topic, 0)
		require.True(t, ok)
		require.NoError(t, l.Err)
		require.EqualValues(t, 0, l.Lag, "the group's lag on a transactional partition it has consumed whole")
		r.stop(t)
		mu.Lock()
		defer mu.Unlock()
		var want []string
		for _, ev := range append(first, second...) {
			want = append(want, ev.MessageID)
		}
		require.Equal(t, want, handled, "the committed records, each once; no marker reached the handler")
	})
}
