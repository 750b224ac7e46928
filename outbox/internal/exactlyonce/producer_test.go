package exactlyonce_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
)

// fakeCluster is a kfake cluster with topic "t" and the options of its clients.
func fakeCluster(t *testing.T) (*kfake.Cluster, []kgo.Opt) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c, []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordRetries(1)}
}

// manual are the producer options of a relay's: records wait for a Flush.
func manual(opts []kgo.Opt) []kgo.Opt {
	return append(opts[:len(opts):len(opts)], kgo.ManualFlushing())
}

// committed reads topic's records as a read_committed reader does.
func committed(t *testing.T, opts []kgo.Opt, topic string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append(opts, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())...)
	require.NoError(t, err)
	defer cl.Close()
	admin, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer admin.Close()
	end := int64(0)
	ends, err := kadmEnds(ctx, admin, topic)
	require.NoError(t, err)
	end = ends
	var out []string
	for next := int64(0); next < end; {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				out = append(out, string(r.Value))
			}
			next = r.Offset + 1
		})
	}
	return out
}

func newProducer(t *testing.T, opts []kgo.Opt, txnID string, c *exactlyonce.Counters) *exactlyonce.Producer {
	t.Helper()
	cfg := exactlyonce.Config{TransactionalID: txnID}.WithDefaults()
	p, err := exactlyonce.NewProducer(context.Background(), opts, cfg, c)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// A record Kafka refuses for itself (MESSAGE_TOO_LARGE) does not fail franz-go's transaction:
// EndTransaction would commit the others without it. Commit aborts instead, and says why.
func TestCommitAbortsWhenARecordFailed(t *testing.T) {
	ctx := context.Background()
	c, opts := fakeCluster(t)
	var counters exactlyonce.Counters
	p := newProducer(t, opts, "r", &counters)
	var refuse atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		if !refuse.Load() || req.Topics[0].Topic == exactlyonce.DefaultOffsetsTopic {
			return nil, nil, false
		}
		refuse.Store(false)
		return testenv.ProduceError(req, kerr.MessageTooLarge.Code), nil, true
	})

	require.NoError(t, p.Begin())
	require.NoError(t, p.Client().ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("kept")}).FirstErr())
	refuse.Store(true)
	require.Error(t, p.Client().ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("refused")}).FirstErr())
	err := p.Commit(ctx, exactlyonce.PositionRecord(exactlyonce.DefaultOffsetsTopic, "r", exactlyonce.Position{LSN: 1}))
	require.ErrorIs(t, err, exactlyonce.ErrRecordFailed)
	require.ErrorIs(t, err, kerr.MessageTooLarge)
	require.False(t, p.Open())
	require.Equal(t, int64(1), counters.Aborted())
	require.Empty(t, committed(t, opts, "t"), "the transaction's records are aborted")

	// The next transaction starts clean.
	require.NoError(t, p.Begin())
	require.NoError(t, p.Client().ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("next")}).FirstErr())
	require.NoError(t, p.Commit(ctx, exactlyonce.PositionRecord(exactlyonce.DefaultOffsetsTopic, "r", exactlyonce.Position{LSN: 2})))
	require.Equal(t, []string{"next"}, committed(t, opts, "t"))
	require.Equal(t, int64(1), counters.Committed())
	pos, err := exactlyonce.ReadPosition(ctx, opts, exactlyonce.DefaultOffsetsTopic, "r")
	require.NoError(t, err)
	require.Equal(t, uint64(2), pos.LSN)
}

// A producer whose transactional id a newer producer initialized is fenced: its open
// transaction is aborted, and its Commit returns ErrFenced.
func TestCommitOfAFencedProducer(t *testing.T) {
	ctx := context.Background()
	_, opts := fakeCluster(t)
	var counters exactlyonce.Counters
	zombie := newProducer(t, manual(opts), "z", &counters)
	require.NoError(t, zombie.Begin())
	zombie.Client().Produce(ctx, &kgo.Record{Topic: "t", Value: []byte("zombie")}, nil)
	require.NoError(t, zombie.Client().Flush(ctx))

	successor := newProducer(t, manual(opts), "z", nil)
	err := zombie.Commit(ctx, exactlyonce.PositionRecord(exactlyonce.DefaultOffsetsTopic, "z", exactlyonce.Position{LSN: 9}))
	require.ErrorIs(t, err, exactlyonce.ErrFenced, "%v", err)
	require.Equal(t, int64(1), counters.Fenced())
	require.Empty(t, committed(t, opts, "t"))

	require.NoError(t, successor.Begin())
	successor.Client().Produce(ctx, &kgo.Record{Topic: "t", Value: []byte("successor")}, nil)
	require.NoError(t, successor.Commit(ctx, exactlyonce.PositionRecord(exactlyonce.DefaultOffsetsTopic, "z", exactlyonce.Position{LSN: 10})))
	require.Equal(t, []string{"successor"}, committed(t, opts, "t"))
	pos, err := exactlyonce.ReadPosition(ctx, opts, exactlyonce.DefaultOffsetsTopic, "z")
	require.NoError(t, err)
	require.Equal(t, uint64(10), pos.LSN, "the zombie's position never committed")
}

// kadmEnds is topic's partition 0 end offset.
func kadmEnds(ctx context.Context, cl *kgo.Client, topic string) (int64, error) {
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	o, _ := ends.Lookup(topic, 0)
	return o.Offset, o.Err
}

// A staged progress record leaves with the transaction's records in one flush and commits with
// them; one the broker refuses fails the commit, which aborts the records beside it.
func TestStagedProgressCommitsAndAbortsWithTheRecords(t *testing.T) {
	ctx := context.Background()
	c, opts := fakeCluster(t)
	var counters exactlyonce.Counters
	p := newProducer(t, manual(opts), "s", &counters)
	require.ErrorContains(t, p.Stage(ctx, exactlyonce.PositionRecord(exactlyonce.DefaultOffsetsTopic, "s", exactlyonce.Position{LSN: 1})),
		"no transaction is open")

	var produces atomic.Int32
	var refuse atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		produces.Add(1)
		if refuse.Load() {
			return testenv.ProduceError(kreq.(*kmsg.ProduceRequest), kerr.MessageTooLarge.Code), nil, true
		}
		return nil, nil, false
	})

	// A first transaction loads both partitions' metadata into the client, so that the one
	// after has both ready when it flushes (a partition whose metadata is still loading would
	// leave in a request of its own, whatever the producer does).
	require.NoError(t, p.Begin())
	p.Client().Produce(ctx, &kgo.Record{Topic: "t", Value: []byte("zero")}, nil)
	require.NoError(t, p.Stage(ctx, exactlyonce.PositionRecord(exactlyonce.DefaultOffsetsTopic, "s", exactlyonce.Position{LSN: 6})))
	require.NoError(t, p.Commit(ctx, nil))
	produces.Store(0)

	require.NoError(t, p.Begin())
	p.Client().Produce(ctx, &kgo.Record{Topic: "t", Value: []byte("one")}, nil)
	require.NoError(t, p.Stage(ctx, exactlyonce.PositionRecord(exactlyonce.DefaultOffsetsTopic, "s", exactlyonce.Position{LSN: 7})))
	require.NoError(t, p.Client().Flush(ctx))
	require.Equal(t, int32(1), produces.Load(), "the record and the progress record leave in one produce request")
	require.NoError(t, p.Commit(ctx, nil))
	require.Equal(t, []string{"zero", "one"}, committed(t, opts, "t"))
	pos, err := exactlyonce.ReadPosition(ctx, opts, exactlyonce.DefaultOffsetsTopic, "s")
	require.NoError(t, err)
	require.Equal(t, uint64(7), pos.LSN)

	// The records are out; the progress record alone is refused.
	require.NoError(t, p.Begin())
	p.Client().Produce(ctx, &kgo.Record{Topic: "t", Value: []byte("two")}, nil)
	require.NoError(t, p.Client().Flush(ctx))
	require.NoError(t, p.Stage(ctx, exactlyonce.PositionRecord(exactlyonce.DefaultOffsetsTopic, "s", exactlyonce.Position{LSN: 8})))
	refuse.Store(true)
	err = p.Commit(ctx, nil)
	refuse.Store(false)
	require.ErrorIs(t, err, exactlyonce.ErrRecordFailed)
	require.Equal(t, int64(1), counters.Aborted())
	require.Equal(t, []string{"zero", "one"}, committed(t, opts, "t"), "the records beside a refused progress record are aborted")
	pos, err = exactlyonce.ReadPosition(ctx, opts, exactlyonce.DefaultOffsetsTopic, "s")
	require.NoError(t, err)
	require.Equal(t, uint64(7), pos.LSN)
}
