package outbox_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// event returns a valid event for topic with the given key (nil for none).
func event(id, topic string, key *string, payload string) envelope.Event {
	return envelope.Event{
		MessageID:   id,
		Source:      "ordering",
		Destination: topic,
		Key:         key,
		EventType:   "OrderPlaced",
		ContentType: envelope.ContentTypeJSON,
		Payload:     []byte(payload),
		OccurredAt:  time.Date(2026, 11, 29, 8, 0, 0, 123456000, time.UTC),
	}
}

func ptr[T any](v T) *T { return &v }

// enqueue writes events in one committed transaction.
func enqueue(t testing.TB, pool *pgxpool.Pool, st *outbox.Store, events ...envelope.Event) []outbox.EnqueueResult {
	t.Helper()
	var res []outbox.EnqueueResult
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		res, err = st.EnqueueTx(context.Background(), tx, events...)
		return err
	})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return res
}

// keyedEvents returns n events spread over keys keys, message ids "m-<i>" and payload "<key>:<i>".
func keyedEvents(topic string, n, keys int) []envelope.Event {
	evs := make([]envelope.Event, n)
	for i := range n {
		k := fmt.Sprintf("k%d", i%keys)
		evs[i] = event(fmt.Sprintf("m-%06d", i), topic, &k, fmt.Sprintf(`{"i":%d}`, i))
	}
	return evs
}

// outboxOpts are the relay client's options in tests: ProducerOpts with fast franz-go retries.
func outboxOpts() []kgo.Opt {
	opts := append(outbox.ProducerOpts(), kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond }),
		kgo.MetadataMinAge(10*time.Millisecond))
	if os.Getenv("KEIRO_TEST_KGO_LOG") != "" {
		opts = append(opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, func() string {
			return time.Now().Format("15:04:05.000000 ")
		})))
	}
	return opts
}

// autoCreatePartitions is the partition count of the topics the embedded broker of these tests
// creates on first use: kfake's own default, so that a test's rows spread over partitions
// unless it creates its topic with fewer.
const autoCreatePartitions = 10

// newKafka starts the embedded broker of one test, topics created on first use having
// autoCreatePartitions partitions; opts are applied after the kit's own.
func newKafka(t testing.TB, opts ...kfake.Opt) *testenv.Kafka {
	t.Helper()
	return testenv.NewKafkaWith(t, testenv.KafkaConfig{Partitions: autoCreatePartitions, ClusterOpts: opts})
}

// rig returns a fresh schema, a kfake cluster with topic "orders" of the given partitions, and
// the schema's outbox Store: the start of every relay test.
func rig(t testing.TB, partitions int32) (*testenv.DB, *testenv.Kafka, *outbox.Store) {
	t.Helper()
	db := testenv.NewDB(t)
	kc := newKafka(t)
	kc.CreateTopic(t, "orders", partitions)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	return db, kc, st
}

// maintenancePass runs r's maintenance pass until one takes the maintenance lock (a running
// relay's own maintenance takes the same lock now and then: a pass that found it held did
// nothing) and returns that pass's result.
func maintenancePass(t testing.TB, r *outbox.Relay) outbox.MaintenanceResult {
	t.Helper()
	var res outbox.MaintenanceResult
	testenv.WaitFor(t, time.Minute, "a maintenance pass that took the lock", func() bool {
		var err error
		res, err = r.MaintenancePass(context.Background())
		require.NoError(t, err)
		return res.Ran
	})
	return res
}
