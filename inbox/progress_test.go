package inbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// A handler that blocks on one partition's record leaves that partition stuck, with the record
// in flight and its timestamp as the oldest waiting, while the other partition commits and is
// not stuck; once the handler returns the partition moves again.
func TestConsumerProgressNamesTheStuckPartition(t *testing.T) {
	t.Parallel()
	kc := testenv.NewKafka(t)
	db := testenv.NewDB(t)
	topic := kc.Topic("billing.progress.v1")
	kc.CreateTopic(t, topic, 2)
	prod := kc.NewClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))

	stuck := newEvent("progress", topic)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, _ pgx.Tx, ev envelope.Event) error {
		if ev.MessageID == stuck.MessageID {
			once.Do(func() { close(entered) })
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	p := newProgress()
	cfg := inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("progress"), Topics: []string{topic}, BatchSize: 1,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}
	run := startConsumer(t, db.Pool, cfg, h)

	rec := func(ev envelope.Event, partition int32) *kgo.Record {
		r := toKgo(ev.Record(envelope.EncodeOptions{}))
		r.Partition = partition
		return r
	}
	stuckAt := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	first := rec(stuck, 0)
	first.Timestamp = stuckAt
	produce(t, prod, first, rec(newEvent("progress", topic), 0))
	produce(t, prod, rec(newEvent("progress", topic), 1), rec(newEvent("progress", topic), 1), rec(newEvent("progress", topic), 1))

	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never received the record it blocks on")
	}
	p.waitCommitted(t, topic, 3, 30*time.Second) // partition 1's three records

	later := time.Now().Add(time.Hour)
	ps := run.c.Progress()
	require.Len(t, ps, 2)
	p0, p1 := ps[0], ps[1]
	require.Equal(t, int32(0), p0.Partition)
	require.EqualValues(t, 0, p0.InFlight, "the blocked record is in flight")
	require.False(t, p0.InFlightSince.IsZero())
	require.GreaterOrEqual(t, p0.Waiting, 1)
	require.True(t, p0.OldestWaiting.Equal(stuckAt), "oldest waiting %s, want the blocked record's timestamp %s", p0.OldestWaiting, stuckAt)
	require.EqualValues(t, -1, p0.Committed)
	since, isStuck := p0.StuckSince(later, inbox.DefaultStuckAfter)
	require.True(t, isStuck, "partition 0 is stuck")
	require.Equal(t, p0.MovedAt, since)

	require.Equal(t, int32(1), p1.Partition)
	require.EqualValues(t, -1, p1.InFlight)
	require.Zero(t, p1.Waiting)
	require.True(t, p1.OldestWaiting.IsZero())
	require.EqualValues(t, 3, p1.Committed)
	require.False(t, p1.CommittedAt.IsZero())
	_, isStuck = p1.StuckSince(later, inbox.DefaultStuckAfter)
	require.False(t, isStuck, "partition 1 has nothing waiting")

	close(release)
	p.waitCommitted(t, topic, 5, 30*time.Second)
	for _, pp := range run.c.Progress() {
		_, isStuck := pp.StuckSince(later, inbox.DefaultStuckAfter)
		require.False(t, isStuck, "partition %d after the handler returned: %+v", pp.Partition, pp)
		require.Zero(t, pp.Waiting)
	}
	run.stop(t)
	require.Empty(t, run.c.Progress(), "no partition is owned once Run returned")
}
