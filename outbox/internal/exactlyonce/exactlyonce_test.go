package exactlyonce_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
)

func cluster(t *testing.T) []kgo.Opt {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
}

// txnClient is a transactional producer of txnID.
func txnClient(t *testing.T, opts []kgo.Opt, txnID string) *kgo.Client {
	cl, err := kgo.NewClient(append(opts, kgo.TransactionalID(txnID), kgo.TransactionTimeout(10*time.Second))...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// produceIn produces recs in one transaction and ends it with commit.
func produceIn(t *testing.T, cl *kgo.Client, commit kgo.TransactionEndTry, recs ...*kgo.Record) {
	ctx := context.Background()
	require.NoError(t, cl.BeginTransaction())
	for _, r := range recs {
		require.NoError(t, cl.ProduceSync(ctx, r).FirstErr())
	}
	require.NoError(t, cl.Flush(ctx))
	require.NoError(t, cl.EndTransaction(ctx, commit))
}

// The position read back is the last one committed: an aborted one, and another id's, are not.
func TestReadPositionIsTheLastCommitted(t *testing.T) {
	ctx := context.Background()
	opts := cluster(t)
	admin, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer admin.Close()
	topic := exactlyonce.DefaultOffsetsTopic
	require.NoError(t, exactlyonce.EnsureTopic(ctx, admin, topic))
	require.NoError(t, exactlyonce.EnsureTopic(ctx, admin, topic), "an existing compacted topic is accepted")

	_, err = exactlyonce.ReadPosition(ctx, opts, topic, "a")
	require.ErrorIs(t, err, exactlyonce.ErrNoRecord)

	a := txnClient(t, opts, "a")
	b := txnClient(t, opts, "b")
	produceIn(t, a, kgo.TryCommit, exactlyonce.PositionRecord(topic, "a", exactlyonce.Position{LSN: 100, Slot: "s"}))
	produceIn(t, b, kgo.TryCommit, exactlyonce.PositionRecord(topic, "b", exactlyonce.Position{LSN: 999, Slot: "s"}))
	produceIn(t, a, kgo.TryCommit, exactlyonce.PositionRecord(topic, "a", exactlyonce.Position{LSN: 200, Slot: "s"}))
	produceIn(t, a, kgo.TryAbort, exactlyonce.PositionRecord(topic, "a", exactlyonce.Position{LSN: 300, Slot: "s"}))

	p, err := exactlyonce.ReadPosition(ctx, opts, topic, "a")
	require.NoError(t, err)
	require.Equal(t, uint64(200), p.LSN)

	// A tombstone of the key (an operator's reset) leaves no position.
	produceIn(t, b, kgo.TryCommit, &kgo.Record{Topic: topic, Key: []byte(exactlyonce.PositionKey("b"))})
	_, err = exactlyonce.ReadPosition(ctx, opts, topic, "b")
	require.ErrorIs(t, err, exactlyonce.ErrNoRecord)

	produceIn(t, a, kgo.TryCommit, exactlyonce.ClaimsRecord(topic, "a", exactlyonce.Claims{Tokens: []string{"t1", "t2"}}))
	c, err := exactlyonce.ReadClaims(ctx, opts, topic, "a")
	require.NoError(t, err)
	require.Equal(t, []string{"t1", "t2"}, c.Tokens)
}

// A fenced producer can neither produce nor commit; its open transaction is aborted, so a
// reader never sees it.
func TestFenceAbortsTheOpenTransaction(t *testing.T) {
	ctx := context.Background()
	opts := cluster(t)
	admin, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer admin.Close()
	topic := exactlyonce.DefaultOffsetsTopic
	require.NoError(t, exactlyonce.EnsureTopic(ctx, admin, topic))

	zombie := txnClient(t, opts, "z")
	produceIn(t, zombie, kgo.TryCommit, exactlyonce.PositionRecord(topic, "z", exactlyonce.Position{LSN: 1}))
	require.NoError(t, zombie.BeginTransaction())
	require.NoError(t, zombie.ProduceSync(ctx, exactlyonce.PositionRecord(topic, "z", exactlyonce.Position{LSN: 2})).FirstErr())

	require.NoError(t, exactlyonce.Fence(ctx, opts, "z"))
	p, err := exactlyonce.ReadPosition(ctx, opts, topic, "z")
	require.NoError(t, err)
	require.Equal(t, uint64(1), p.LSN, "the fenced producer's open transaction is aborted")

	err = zombie.EndTransaction(ctx, kgo.TryCommit)
	require.Error(t, err, "a fenced producer cannot commit")
	require.True(t, errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.OperationNotAttempted) || errors.Is(err, kerr.InvalidTxnState), "%v", err)
}

// An offsets topic that is not compacted, or has more than one partition, is refused.
func TestEnsureTopicRefusesAWrongTopic(t *testing.T) {
	ctx := context.Background()
	opts := cluster(t)
	admin, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer admin.Close()
	_, err = kgoCreate(ctx, admin, "two", 2, nil)
	require.NoError(t, err)
	require.ErrorContains(t, exactlyonce.EnsureTopic(ctx, admin, "two"), "has 2 partitions")
	del := "delete"
	_, err = kgoCreate(ctx, admin, "deleting", 1, &del)
	require.NoError(t, err)
	require.ErrorContains(t, exactlyonce.EnsureTopic(ctx, admin, "deleting"), "cleanup.policy=delete")
}

func kgoCreate(ctx context.Context, cl *kgo.Client, topic string, partitions int32, policy *string) (kadm.CreateTopicResponse, error) {
	cfg := map[string]*string{}
	if policy != nil {
		cfg["cleanup.policy"] = policy
	}
	r, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, cfg, topic)
	if err == nil {
		err = r.Err
	}
	return r, err
}

// A record under a relay's key that is not its progress (written by hand, by another tool, or
// cut short) is refused with the key named, never read as a position or claims of zero; a
// valid record written after it is read again. Values: a fixed nasty list and generated bytes.
func TestReadRefusesRecordsThatAreNotProgress(t *testing.T) {
	ctx := context.Background()
	opts := cluster(t)
	admin, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer admin.Close()
	topic := exactlyonce.DefaultOffsetsTopic
	require.NoError(t, exactlyonce.EnsureTopic(ctx, admin, topic))
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	values := [][]byte{{}, {0}, []byte("null "), []byte("{}"), []byte(`{"lsn":null,"tokens":null}`), []byte("{"), []byte(`"lsn"`), []byte(`{"lsn":"12"}`),
		[]byte(`{"lsn":-1}`), []byte(`{"tokens":"t"}`), []byte(`[1,2]`), []byte("\xff\xfe\x00\x01"),
		bytes.Repeat([]byte("{"), 100_000)}
	for range 6 {
		v := make([]byte, rng.IntN(512))
		for i := range v {
			v[i] = byte(rng.IntN(256))
		}
		values = append(values, v)
	}
	w := txnClient(t, opts, "w")
	for i, v := range values {
		produceIn(t, w, kgo.TryCommit, &kgo.Record{Topic: topic, Key: []byte(exactlyonce.PositionKey("w")), Value: v},
			&kgo.Record{Topic: topic, Key: []byte(exactlyonce.ClaimsKey("w")), Value: v})
		_, perr := exactlyonce.ReadPosition(ctx, opts, topic, "w")
		_, cerr := exactlyonce.ReadClaims(ctx, opts, topic, "w")
		require.ErrorContains(t, perr, exactlyonce.PositionKey("w"), "value %d %q", i, v[:min(len(v), 40)])
		require.ErrorContains(t, cerr, exactlyonce.ClaimsKey("w"), "value %d %q", i, v[:min(len(v), 40)])
	}
	produceIn(t, w, kgo.TryCommit, exactlyonce.PositionRecord(topic, "w", exactlyonce.Position{LSN: 7}))
	p, err := exactlyonce.ReadPosition(ctx, opts, topic, "w")
	require.NoError(t, err)
	require.Equal(t, uint64(7), p.LSN)
}
