package exactlyonce_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
)

// A committed transaction's records and progress are read back; a failed record aborts the
// whole transaction, which a read_committed reader never sees; the producer goes on.
func TestProducerCommitsAndAborts(t *testing.T) {
	ctx := context.Background()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "events"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordRetries(1)}
	var counters exactlyonce.Counters
	cfg := exactlyonce.Config{TransactionalID: "p"}.WithDefaults()
	p, err := exactlyonce.NewProducer(ctx, opts, cfg, &counters)
	require.NoError(t, err)
	defer p.Close(ctx)

	require.NoError(t, p.Begin())
	require.NoError(t, p.Client().ProduceSync(ctx, &kgo.Record{Topic: "events", Value: []byte("one")}).FirstErr())
	require.NoError(t, p.Commit(ctx, exactlyonce.PositionRecord(cfg.OffsetsTopic, "p", exactlyonce.Position{LSN: 1})))

	// The next produce is refused for good: the transaction cannot commit.
	c.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
		return testenv.ProduceError(r.(*kmsg.ProduceRequest), kerr.MessageTooLarge.Code), nil, true
	})
	require.NoError(t, p.Begin())
	p.Client().Produce(ctx, &kgo.Record{Topic: "events", Value: []byte("refused")}, nil)
	err = p.Commit(ctx, exactlyonce.PositionRecord(cfg.OffsetsTopic, "p", exactlyonce.Position{LSN: 2}))
	require.ErrorIs(t, err, kerr.MessageTooLarge)
	require.False(t, p.Open(), "the failed transaction is aborted")

	require.NoError(t, p.Begin())
	require.NoError(t, p.Client().ProduceSync(ctx, &kgo.Record{Topic: "events", Value: []byte("three")}).FirstErr())
	require.NoError(t, p.Commit(ctx, exactlyonce.PositionRecord(cfg.OffsetsTopic, "p", exactlyonce.Position{LSN: 3})))

	require.Equal(t, []string{"one", "three"}, committed(t, opts, "events"))
	pos, err := exactlyonce.ReadPosition(ctx, opts, cfg.OffsetsTopic, "p")
	require.NoError(t, err)
	require.Equal(t, uint64(3), pos.LSN)
	require.Equal(t, int64(2), counters.Committed())
	require.Equal(t, int64(1), counters.Aborted())
}

// A producer whose id a newer one initialized is fenced: its open transaction never becomes
// visible, and its commit fails with ErrFenced (on a real broker; kfake answers
// INVALID_TXN_STATE).
func TestProducerFencedByItsSuccessor(t *testing.T) {
	testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, k *testenv.Kafka) {
		ctx := context.Background()
		events := k.Topic("events")
		k.CreateTopic(t, events, 1)
		opts := []kgo.Opt{kgo.SeedBrokers(k.Seeds...)}
		cfg := exactlyonce.Config{TransactionalID: k.Topic("z"), OffsetsTopic: k.Topic("offsets")}.WithDefaults()
		var counters exactlyonce.Counters
		zombie, err := exactlyonce.NewProducer(ctx, opts, cfg, &counters)
		require.NoError(t, err)
		defer zombie.Close(ctx)
		require.NoError(t, zombie.Begin())
		require.NoError(t, zombie.Client().ProduceSync(ctx, &kgo.Record{Topic: events, Value: []byte("zombie")}).FirstErr())

		successor, err := exactlyonce.NewProducer(ctx, opts, cfg, &counters)
		require.NoError(t, err)
		defer successor.Close(ctx)
		require.NoError(t, successor.Begin())
		require.NoError(t, successor.Client().ProduceSync(ctx, &kgo.Record{Topic: events, Value: []byte("successor")}).FirstErr())
		require.NoError(t, successor.Commit(ctx, nil))

		err = zombie.Commit(ctx, nil)
		require.Error(t, err)
		if k.Cluster == nil {
			require.ErrorIs(t, err, exactlyonce.ErrFenced)
			require.Equal(t, int64(1), counters.Fenced())
		} else {
			require.True(t, errors.Is(err, exactlyonce.ErrFenced) || errors.Is(err, kerr.InvalidTxnState), "%v", err)
		}
		require.Equal(t, []string{"successor"}, committed(t, opts, events))
	})
}
