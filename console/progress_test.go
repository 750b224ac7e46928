package console_test

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// lateProgress is the console's progress source for a consumer built after the rig.
type lateProgress struct {
	c atomic.Pointer[inbox.Consumer]
}

func (l *lateProgress) Progress() []inbox.PartitionProgress {
	if c := l.c.Load(); c != nil {
		return c.Progress()
	}
	return nil
}

// TestConsumerLagNamesStuckPartition runs a real consumer whose handler blocks on one
// partition's record: the lag API and the overview name that partition stuck, with its record
// in flight, while the other partition, whose records are all committed, is not.
func TestConsumerLagNamesStuckPartition(t *testing.T) {
	t.Parallel()
	src := &lateProgress{}
	r := newRig(t, func(c *console.Config) {
		c.Inbox.Progress = src
		c.Inbox.StuckAfter = time.Nanosecond // stuck as soon as a waiting partition is not moving
	})
	const topic = "orders.stuck.v1"
	r.kc.CreateTopic(t, topic, 2)

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	committed := make(chan inbox.Commit, 16)
	cons, err := inbox.NewConsumer(r.db.Pool, inbox.ConsumerConfig{
		Brokers: r.kc.Seeds, Group: consumerName, Topics: []string{topic}, BatchSize: 1,
		Store:       inbox.StoreConfig{Schema: r.db.Schema, Consumer: consumerName},
		KafkaOpts:   []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
		Logger:      slog.New(slog.DiscardHandler),
		OnCommitted: func(c inbox.Commit) { committed <- c },
	}, func(ctx context.Context, _ pgx.Tx, ev envelope.Event) error {
		if string(ev.Payload) == `{"stuck":true}` {
			once.Do(func() { close(entered) })
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	require.NoError(t, err)
	src.c.Store(cons)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	prod := r.kc.NewClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	rec := func(id string, p int32, payload string) *kgo.Record {
		ev := event(id, topic, ptr("k"+id), payload)
		kr := ev.Record(envelope.EncodeOptions{})
		out := &kgo.Record{Topic: topic, Partition: p, Key: kr.Key, Value: kr.Value}
		for _, h := range kr.Headers {
			out.Headers = append(out.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		return out
	}
	require.NoError(t, prod.ProduceSync(context.Background(), rec("s1", 0, `{"stuck":true}`), rec("s2", 0, `{}`),
		rec("m1", 1, `{}`), rec("m2", 1, `{}`)).FirstErr())
	<-entered
	for c := range committed {
		if c.Partition == 1 && c.Offset == 2 {
			break
		}
	}

	var lag console.ConsumerLag
	a := r.get(t, "/api/v1/consumer/lag")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &lag)
	require.Len(t, lag.Partitions, 2, a.body)
	require.Equal(t, 1, lag.Stuck, a.body)
	p0, p1 := lag.Partitions[0], lag.Partitions[1]
	require.NotNil(t, p0.Progress, a.body)
	require.NotNil(t, p0.Progress.StuckSince, "partition 0 is stuck: %s", a.body)
	require.NotNil(t, p0.Progress.InFlight)
	require.EqualValues(t, 0, *p0.Progress.InFlight)
	require.NotNil(t, p0.Progress.OldestWaitingAgeSeconds)
	require.Nil(t, p0.Progress.LastCommitAgeSeconds, "partition 0 never committed")
	require.NotNil(t, p1.Progress, a.body)
	require.Nil(t, p1.Progress.StuckSince, "partition 1 moved: %s", a.body)
	require.Nil(t, p1.Progress.InFlight)
	require.Zero(t, p1.Progress.Waiting)
	require.NotNil(t, p1.Progress.LastCommitAgeSeconds)

	page := r.get(t, "/console/").body
	require.Contains(t, page, `<b class="bad-text" id="stuck-count">1 stuck</b>`)
	require.Regexp(t, `(?s)<tr id="lag-`+topic+`-0" class="stuck">.*?stuck since`, page)
	require.Regexp(t, `(?s)<tr id="lag-`+topic+`-1" class="">.*?idle`, page)

	close(release)
}
