package outbox_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
	"github.com/keiro-go/keiro/outbox"
)

// TestRelayOnBothBrokers: the relay publishes 2 000 rows over 40 keys to a topic of 3
// partitions, each once and in key order, on the embedded broker and on a real one.
func TestRelayOnBothBrokers(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{Partitions: autoCreatePartitions}, func(t *testing.T, kc *testenv.Kafka) {
		db := testenv.NewDB(t)
		topic := kc.Topic("orders")
		kc.CreateTopic(t, topic, 3)
		st, err := outbox.NewStore(db.Schema)
		require.NoError(t, err)
		const n = 2000
		enqueue(t, db.Pool, st, keyedEvents(topic, n, 40)...)
		p := new(testenv.Progress)
		startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), Logger: testLogger(t)})
		p.Wait(t, int64(n), time.Minute, nil)
		distinct, dups := checkOrder(t, kc.ConsumeRecords(t, n+1, 10*time.Second, topic))
		require.Equal(t, n, distinct)
		require.Zero(t, dups)
	})
}

// TestRelayRejectsWhatTheRealBrokerRefuses: a topic whose max.message.bytes is 20 000 refuses
// a 30 000-byte record with MESSAGE_TOO_LARGE; the relay rejects that row at once with a
// readable reason and publishes the rest of its key in order (on the embedded broker the same
// is shown by TestRelayRejectsPoisonRows).
func TestRelayRejectsWhatTheRealBrokerRefuses(t *testing.T) {
	t.Parallel()
	kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true, Partitions: autoCreatePartitions})
	db := testenv.NewDB(t)
	topic := kc.Topic("orders")
	ctx := context.Background()
	limit := "20000"
	resp, err := kadm.NewClient(kc.NewClient(t)).CreateTopic(ctx, 1, -1, map[string]*string{"max.message.bytes": &limit}, topic)
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	evs := keyedEvents(topic, 30, 3)
	big := make([]byte, 30_000)
	_, _ = rand.Read(big) // incompressible
	evs[13].Payload = append([]byte(`{"i":13}`), big...)
	enqueue(t, db.Pool, st, evs...)

	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), PollInterval: 10 * time.Millisecond,
		Backoff: keiro.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}, Logger: testLogger(t)})
	p.Wait(t, 30, time.Minute, nil)
	dead, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, evs[13].MessageID, dead[0].MessageID)
	require.Equal(t, outbox.StatusRejected, dead[0].Status)
	require.Equal(t, "message_too_large", dead[0].RejectionCode)
	distinct, dups := checkOrder(t, kc.ConsumeRecords(t, 30, 10*time.Second, topic))
	require.Equal(t, 29, distinct)
	require.Zero(t, dups)
}

// TestRelayWaitsOutARealBrokerOutage: the relay's only broker is SIGKILLed while rows flow and
// restarted later. Rows enqueued meanwhile wait without using attempts (none goes dead, even
// with MaxAttempts 2), and once the broker is back every row is on the topic, in key order;
// the only duplicates are rows whose produce was in flight at the kill.
func TestRelayWaitsOutARealBrokerOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := kafkabroker.Start(ctx, kafkabroker.Config{Props: map[string]string{"auto.create.topics.enable": "false"}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	k := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true, Brokers: c.Seeds()})
	topic := k.Topic("orders")
	k.CreateTopic(t, topic, 3)
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	evs := keyedEvents(topic, 600, 20)
	enqueue(t, db.Pool, st, evs[:200]...)

	deferred := make(chan struct{}, 1)
	p := new(testenv.Progress)
	startRelayOpts(t, db, k, outboxOpts(), outbox.RelayConfig{
		MaxAttempts: 2, Backoff: keiro.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
		PollInterval: 10 * time.Millisecond, Logger: testLogger(t),
		OnBatch: func(b outbox.BatchResult) {
			p.Add(settledRows(b))
			if b.Retried > 0 {
				select {
				case deferred <- struct{}{}:
				default:
				}
			}
		},
	})
	p.Wait(t, 200, time.Minute, nil)
	require.NoError(t, c.Brokers[0].Kill())
	enqueue(t, db.Pool, st, evs[200:]...)
	// The relay's next batch meets the dead broker: it is deferred (the records were never sent)
	// or stays in flight (franz-go's idempotent producer does not give up on a batch it may have
	// sent, and retries it once the broker is back).
	for deadline, wasDeferred := time.Now().Add(time.Minute), false; !wasDeferred; {
		var publishing int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox WHERE status = 'publishing'").Scan(&publishing))
		if publishing > 0 {
			break
		}
		require.False(t, time.Now().After(deadline), "the relay did nothing with the rows enqueued while the broker was down")
		select {
		case <-deferred:
			wasDeferred = true
		case <-time.After(20 * time.Millisecond): // polls the relay's progress in the table
		}
	}
	require.NoError(t, c.Brokers[0].Restart(ctx))
	p.Wait(t, int64(len(evs)), 2*time.Minute, nil)
	var unsent int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox WHERE status <> 'sent'").Scan(&unsent))
	require.Zero(t, unsent, "every row sent: an outage uses no attempts, so none went dead")
	distinct, _ := checkOrder(t, k.ConsumeRecords(t, len(evs)+1, 10*time.Second, topic))
	require.Equal(t, len(evs), distinct)
}
