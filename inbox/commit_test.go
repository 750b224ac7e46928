package inbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/tracing"
)

// TestConsumerRetriesAFailedCommitOnAQuietPartition: the offset commit that covers a
// partition's last record fails, twice, and no record follows it. The worker must retry the
// commit on its own after its backoff, not wait for a record that may never come: until then
// the group's committed offset stays behind (its lag never reads 0) and a rebalance redelivers
// the records. The committed count covers every record once, across the failed attempts.
func TestConsumerRetriesAFailedCommitOnAQuietPartition(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic, group = "billing.quiet-commit.v1", "billing"
	kc.CreateTopic(t, topic, 1)
	evs := []envelope.Event{newEvent("ordering", topic), newEvent("ordering", topic), newEvent("ordering", topic)}
	produceEvents(t, kc.NewClient(t), evs...)

	// Refuse every commit short of the last record, and the first two that reach it.
	var refusedAtEnd, refused atomic.Int64
	kc.Cluster.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		if req.Group != group {
			return nil, nil, false
		}
		atEnd := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				atEnd = atEnd || rp.Offset == int64(len(evs))
			}
		}
		if atEnd && refusedAtEnd.Add(1) > 2 {
			return nil, nil, false
		}
		refused.Add(1)
		return testenv.OffsetCommitError(req, kerr.OffsetMetadataTooLarge.Code), nil, true
	})

	p := newProgress()
	reader := sdkmetric.NewManualReader()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: group, Topics: []string{topic},
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Store:         inbox.StoreConfig{Schema: db.Schema},
		Retry:         keiro.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		OnCommitted:   p.onCommitted,
	}, fx.handler())
	p.waitCommitted(t, topic, int64(len(evs)), 30*time.Second)

	require.EqualValues(t, 3, refusedAtEnd.Load(), "two refusals at the end, then the retry that landed")
	require.EqualValues(t, len(evs), r.c.Stats().Processed)
	require.EqualValues(t, len(evs), r.c.Stats().Committed, "each record counted once across the retries")
	// Every refusal is one failed commit, counted and measured with the partition and the
	// Kafka error.
	require.EqualValues(t, refused.Load(), r.c.Stats().CommitFailures)
	failures := counterBy(t, reader, tracing.MetricConsumerCommitFailures,
		tracing.GroupKey, tracing.DestinationKey, tracing.PartitionKey, tracing.ErrorTypeKey)
	require.Equal(t, map[string]int64{group + " " + topic + " 0 offset_metadata_too_large": refused.Load()}, failures)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(kc.NewClient(t)).FetchOffsets(ctx, group)
	require.NoError(t, err)
	o, ok := offs.Lookup(topic, 0)
	require.True(t, ok)
	require.EqualValues(t, len(evs), o.At, "the group's committed offset is at the end")
	r.stop(t)
}
