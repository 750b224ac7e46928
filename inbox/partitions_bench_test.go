package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// BenchmarkConsumerPartitions drains b.N records spread evenly over 4 and over 32 partitions,
// every partition processed at once (MaxConcurrentPartitions), a batch handler writing the
// effects. The records and the work are the same; what grows with the partitions is the number
// of offset commits, which the consumer gathers into one request at a time
// (inbox/internal/offsets). It reports msgs/s, the commits (a partition's offset committed) and
// the OffsetCommit requests that carried them. On a real broker:
//
//	KEIRO_BENCH_KAFKA=real go test ./inbox/ -run '^$' -bench ConsumerPartitions -benchtime 100000x
func BenchmarkConsumerPartitions(b *testing.B) {
	for _, parts := range []int{4, 32} {
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) { benchSpread(b, parts) })
	}
}

func benchSpread(b *testing.B, parts int) {
	db := testenv.NewDB(b)
	fx := newEffects(b, db)
	kc := testenv.BenchKafka(b, testenv.KafkaConfig{})
	topic := kc.Topic("bench.partitions.v1")
	kc.CreateTopic(b, topic, int32(parts))
	prod := kc.NewClient(b, kgo.ProducerBatchMaxBytes(1<<20), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	recs := benchRecords(b, benchSize(b), topic, 0)
	for i := range recs {
		recs[i].Partition = int32(i % parts)
	}
	for i := 0; i < len(recs); i += 5000 {
		produce(b, prod, recs[i:min(i+5000, len(recs))]...)
	}
	p := newProgress()
	var commits atomic.Int64
	requests := &commitRequests{}
	c, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("bench"), Topics: []string{topic},
		BatchHandler: fx.batchInsert, MaxConcurrentPartitions: parts,
		Store: inbox.StoreConfig{Schema: db.Schema, Persistence: inbox.DedupeOnly},
		OnCommitted: func(cm inbox.Commit) {
			commits.Add(1)
			p.onCommitted(cm)
		},
		Logger:    slog.New(slog.DiscardHandler),
		KafkaOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithHooks(requests)},
	}, nil)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	m := startMeter(b)
	go func() { done <- c.Run(ctx) }()
	p.waitCommitted(b, topic, int64(len(recs)), 10*time.Minute)
	m.stop(b, len(recs))
	cancel()
	require.NoError(b, <-done)
	b.ReportMetric(float64(commits.Load()), "commits")
	b.ReportMetric(float64(requests.n.Load()), "commit-requests")
}

// commitRequests counts the OffsetCommit requests a client writes.
type commitRequests struct{ n atomic.Int64 }

func (h *commitRequests) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.OffsetCommit) && err == nil {
		h.n.Add(1)
	}
}

var _ kgo.HookBrokerWrite = (*commitRequests)(nil)
