package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// readCommitted reads topic from the start as a read_committed consumer until n records
// arrived or timeout passed.
func readCommitted(t *testing.T, kc *testenv.Kafka, n int, timeout time.Duration, topic string) []*kgo.Record {
	t.Helper()
	cl := kc.NewClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// A log-mode relay with ExactlyOnce publishes each event once, in key order, to a
// read_committed reader; a record Kafka refuses is a dead letter, and the others are not
// published twice for it. A relay that takes the slot over goes on where Kafka is.
func TestLogModeExactlyOnce(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 3)
	setMaxMessageBytes(t, kc, "orders", "12000")
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	cfg := outbox.RelayConfig{ExactlyOnce: true, Mode: outbox.ModeLog, LogEngine: logrelay.Engine,
		PollInterval: 50 * time.Millisecond, Logger: testLogger(t)}
	r, stop := startRelay(t, db, kc, cfg)
	testenv.WaitFor(t, time.Minute, "the log-mode relay switched the schema", func() bool {
		m, err := outbox.AdminOf(st).Mode(context.Background(), db.Pool)
		return err == nil && m == outbox.ModeLog
	})
	const n = 300
	evs := keyedEvents("orders", n, 12)
	for i := 0; i < n; i += 50 {
		enqueue(t, db.Pool, st, evs[i:i+50]...)
	}
	enqueue(t, db.Pool, st, event("bad", "orders", ptr("k1"), bigPayload(3, 16384)))
	dead := waitDead(t, db.Pool, st, "bad")
	require.Equal(t, "message_too_large", dead.RejectionCode)
	distinct, dups := checkOrder(t, readCommitted(t, kc, n+1, 10*time.Second, "orders"))
	require.Equal(t, n, distinct)
	require.Zero(t, dups)
	require.Positive(t, r.Stats().Published)

	// A second relay on the slot, once the first is gone, goes on where Kafka is.
	stop()
	startRelay(t, db, kc, cfg)
	more := keyedEvents("orders", n+20, 12)[n:]
	enqueue(t, db.Pool, st, more...)
	distinct, dups = checkOrder(t, readCommitted(t, kc, n+21, 10*time.Second, "orders"))
	require.Equal(t, n+20, distinct)
	require.Zero(t, dups)
}
