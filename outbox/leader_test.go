package outbox_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
	"github.com/keiro-go/keiro/outbox"
)

// kgoDefaultMetadataMinAge is franz-go's own MetadataMinAge, which ProducerOpts lowers: a
// client with it retries a partition whose leader moved only after its next metadata refresh,
// up to that long after its last one.
const kgoDefaultMetadataMinAge = 5 * time.Second

// relayClient returns a client for the relay built as the relay binary builds it:
// ProducerOpts and the brokers, without the tests' fast retries (testenv.FastRetries).
func relayClient(t *testing.T, seeds []string) *kgo.Client {
	t.Helper()
	opts := append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, outbox.ProducerOpts()...)
	if os.Getenv("KEIRO_TEST_KGO_LOG") != "" {
		opts = append(opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelDebug, func() string {
			return time.Now().Format("15:04:05.000000 ")
		})))
	}
	client, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	t.Cleanup(client.Close)
	return client
}

// TestRelayRetriesAMovedLeaderWithoutWaiting: the broker answers one produce request with
// NOT_LEADER_FOR_PARTITION for every partition, as a broker does while its controller moves
// its partitions (after a pause past its session), just after the relay's client refreshed
// its metadata. The client retries after its next refresh, which ProducerOpts allows
// DefaultMetadataMinAge later: the retried request reaches the broker well within half of
// franz-go's default interval after the refusal (with that default it came about 5 s after the
// client's last refresh, and the whole flush, holding the heads of its keys, waited for it).
func TestRelayRetriesAMovedLeaderWithoutWaiting(t *testing.T) {
	t.Parallel()
	kc := testenv.NewKafka(t)
	topic := kc.Topic("orders")
	kc.CreateTopic(t, topic, 3)
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)

	var (
		armed                atomic.Bool
		mu                   sync.Mutex
		refusedAt, retriedAt time.Time
	)
	kc.Cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		if armed.CompareAndSwap(true, false) {
			refusedAt = time.Now()
			return testenv.ProduceError(kreq.(*kmsg.ProduceRequest), kerr.NotLeaderForPartition.Code), nil, true
		}
		if !refusedAt.IsZero() && retriedAt.IsZero() {
			retriedAt = time.Now()
		}
		return nil, nil, false
	})
	client := relayClient(t, kc.Seeds)
	require.Equal(t, outbox.DefaultMetadataMinAge, client.OptValue(kgo.MetadataMinAge))
	p := new(testenv.Progress)
	runRelay(t, db, client, outbox.RelayConfig{OnBatch: onSettled(p), Logger: testLogger(t)})

	evs := keyedEvents(topic, 40, 10)
	// The first rows for the topic make the client load its metadata (a refresh just before
	// the refusal, as the refresh a client makes when a paused broker resumes).
	enqueue(t, db.Pool, st, evs[:20]...)
	p.Wait(t, 20, time.Minute, nil)
	armed.Store(true)
	enqueue(t, db.Pool, st, evs[20:]...)
	p.Wait(t, 40, time.Minute, nil)

	mu.Lock()
	defer mu.Unlock()
	require.False(t, refusedAt.IsZero(), "a produce request was refused")
	t.Logf("refused partitions produced to again %s after the refusal", retriedAt.Sub(refusedAt).Round(time.Millisecond))
	require.Less(t, retriedAt.Sub(refusedAt), kgoDefaultMetadataMinAge/2,
		"the refused partitions were produced to again after the client's next metadata refresh, DefaultMetadataMinAge (%s) after its last", outbox.DefaultMetadataMinAge)
	distinct, dups := checkOrder(t, kc.ConsumeRecords(t, 40, 10*time.Second, topic))
	require.Equal(t, 40, distinct)
	require.Zero(t, dups)
}

// TestRelayKeepsPublishingAfterABrokerPause: the relay's only broker is paused (SIGSTOP) past
// its KRaft session while rows keep coming, and continued; its controller (usually) fences it
// as it resumes and gives it its partitions back under new leader epochs, and requests that
// meet that moment are refused with NOT_LEADER_FOR_PARTITION. Every row is published once, in
// its key's order, and the waits between the batches published after the resume are logged:
// with franz-go's default metadata interval the flush that met a moved partition waited about
// 5 s for the client's next refresh, and every batch behind it waited too.
// TestRelayRetriesAMovedLeaderWithoutWaiting refuses a request on purpose on the embedded broker.
func TestRelayKeepsPublishingAfterABrokerPause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := kafkabroker.Start(ctx, kafkabroker.Config{Props: map[string]string{
		"auto.create.topics.enable": "false",
		// A pause past the session (9 s by default) fences the broker as it resumes.
		"broker.session.timeout.ms": "3000",
	}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	k := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true, Brokers: c.Seeds()})
	topic := k.Topic("orders")
	// The broker takes its partitions back one by one: with many, produce requests meet
	// partitions it does not lead yet.
	k.CreateTopic(t, topic, 120)
	db := testenv.NewDB(t)
	dumpOutboxOnFailure(t, db)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)

	var (
		mu   sync.Mutex
		acks []time.Time // when each batch that published rows was marked
	)
	p := new(testenv.Progress)
	_, _, done := runRelay(t, db, relayClient(t, c.Seeds()), outbox.RelayConfig{Logger: testLogger(t),
		OnBatch: func(b outbox.BatchResult) {
			if b.Published > 0 {
				mu.Lock()
				acks = append(acks, time.Now())
				mu.Unlock()
			}
			p.Add(settledRows(b))
		}})

	// Rows come in rounds of one per key, 500 a second, from before the pause until a while
	// after the resume.
	const keys, maxRounds = 50, 400
	evs := keyedEvents(topic, keys*maxRounds, keys)
	enqueue(t, db.Pool, st, evs[:keys]...)
	p.Wait(t, keys, time.Minute, done)
	epochs := leaderEpochs(t, k, topic)

	stop := make(chan struct{})
	var wrote sync.WaitGroup
	rounds := 1
	wrote.Add(1)
	go func() {
		defer wrote.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for ; rounds < maxRounds; rounds++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			enqueue(t, db.Pool, st, evs[rounds*keys:(rounds+1)*keys]...)
		}
	}()
	b := c.Brokers[0]
	require.NoError(t, b.Pause())
	time.Sleep(5 * time.Second) // the pause's length is the test's input: past the broker's session
	require.NoError(t, b.Resume())
	resumed := time.Now()
	time.Sleep(3 * time.Second) // the load lasts a while past the resume: the test's input
	close(stop)
	wrote.Wait()
	p.Wait(t, int64(keys*rounds), time.Minute, done)
	// Whether the controller fences the broker as it resumes is a race between the broker's
	// heartbeat and the controller's session check; it usually does.
	moved := 0
	for part, epoch := range leaderEpochs(t, k, topic) {
		if epoch != epochs[part] {
			moved++
		}
	}
	t.Logf("partitions under a new leader epoch after the pause: %d of %d", moved, len(epochs))

	mu.Lock()
	var gaps []time.Duration
	var longest time.Duration
	for i := 1; i < len(acks); i++ {
		if acks[i-1].After(resumed) {
			gap := acks[i].Sub(acks[i-1])
			gaps = append(gaps, gap.Round(time.Millisecond))
			longest = max(longest, gap)
		}
	}
	mu.Unlock()
	// The waits are logged, not asserted: they follow the machine's load as well as the client
	// (TestRelayRetriesAMovedLeaderWithoutWaiting asserts the client's part on its own).
	t.Logf("waits between the %d batches published after the resume: %v (longest %v; franz-go's default metadata interval was %v)",
		len(gaps)+1, gaps, longest.Round(time.Millisecond), kgoDefaultMetadataMinAge)
	distinct, _ := checkOrder(t, k.ConsumeRecords(t, keys*rounds, 10*time.Second, topic))
	require.Equal(t, keys*rounds, distinct)
}

// leaderEpochs returns the leader epoch of each partition of topic.
func leaderEpochs(t *testing.T, k *testenv.Kafka, topic string) map[int32]int32 {
	t.Helper()
	md, err := kadm.NewClient(k.Client).Metadata(context.Background(), topic)
	require.NoError(t, err)
	out := map[int32]int32{}
	for _, pd := range md.Topics[topic].Partitions {
		out[pd.Partition] = pd.LeaderEpoch
	}
	return out
}
