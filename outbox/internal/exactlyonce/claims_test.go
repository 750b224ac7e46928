package exactlyonce_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
)

// A producer on a manually flushed client (the relay's) commits its records and its progress
// record: the commit flushes them itself.
func TestProducerCommitsOnAManuallyFlushedClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := append(cluster(t), kgo.ManualFlushing())
	cfg := exactlyonce.Config{TransactionalID: "claim-a"}.WithDefaults()
	var counters exactlyonce.Counters
	p, err := exactlyonce.NewProducer(ctx, opts, cfg, &counters)
	require.NoError(t, err)
	defer p.Close(ctx)

	require.NoError(t, p.Begin())
	var produced error
	done := make(chan struct{})
	p.Client().Produce(ctx, &kgo.Record{Topic: cfg.OffsetsTopic, Key: []byte("other"), Value: []byte("v")},
		func(_ *kgo.Record, err error) { produced = err; close(done) })
	require.NoError(t, p.Commit(ctx, exactlyonce.ClaimsRecord(cfg.OffsetsTopic, cfg.TransactionalID,
		exactlyonce.Claims{Tokens: []string{"t1"}, Rows: map[string][]int64{"t1": {1, 2}}})))
	<-done
	require.NoError(t, produced)
	require.Equal(t, int64(1), counters.Committed())

	c, err := exactlyonce.ReadClaims(ctx, opts, cfg.OffsetsTopic, cfg.TransactionalID)
	require.NoError(t, err)
	require.Equal(t, []string{"t1"}, c.Tokens)
	require.Equal(t, []int64{1, 2}, c.Rows["t1"])
}
