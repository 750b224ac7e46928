package inbox_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The Kafka client bounds a fetch in compressed bytes: records compressed 15 to 1 (50 KiB of
// one repeated character, snappy as the relay produces) made every fetch hold 15 times
// FetchMaxPartitionBytes, outside MaxBufferedBytes. The consumer sizes its fetches by the
// ratio it measures, so that what one poll hands a partition stays within the configured
// partition bytes, plus the batch the broker returns whole.
func TestFetchesBoundedDecompressed(t *testing.T) {
	const (
		topic      = "fetch.size.v1"
		n          = 400
		fetch      = 1 << 20
		batchBytes = 128 << 10 // the producer's batches: two records each
	)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	require.NoError(t, err)
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ProducerBatchMaxBytes(batchBytes),
		kgo.ProducerBatchCompression(kgo.SnappyCompression()))
	require.NoError(t, err)
	payload := memBenchPayload(50 << 10)
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, memBenchRecord(topic, i, payload))
	}
	require.NoError(t, prod.ProduceSync(context.Background(), recs...).FirstErr())
	prod.Close()

	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	p := newProgress()
	c, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers: cluster.ListenAddrs(), Group: "fetch-size", Topics: []string{topic},
		Store:       inbox.StoreConfig{Schema: db.Schema},
		OnCommitted: p.onCommitted, Logger: slog.New(slog.DiscardHandler),
		KafkaOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(fetch)},
	}, fx.handler())
	require.NoError(t, err)
	var mu sync.Mutex
	var largest, polls int
	inbox.SetPollHook(c, func(fs kgo.Fetches) {
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			size := 0
			for _, r := range fp.Records {
				size += len(r.Key) + len(r.Value)
				for _, h := range r.Headers {
					size += len(h.Key) + len(h.Value)
				}
			}
			mu.Lock()
			largest, polls = max(largest, size), polls+1
			mu.Unlock()
		})
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	p.waitCommitted(t, topic, n, 2*time.Minute)
	cancel()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d polls, the largest handed the partition %d KiB", polls, largest>>10)
	require.LessOrEqual(t, largest, fetch+batchBytes, "a poll's records, decompressed")
}
