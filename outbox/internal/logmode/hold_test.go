package logmode_test

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/logmode"
)

// keysOf returns n keys that the producer's default partitioner sends to partition p of a
// topic of partitions partitions.
func keysOf(p int32, partitions, n int) []string {
	part := kgo.StickyKeyPartitioner(nil).ForTopic("orders")
	var out []string
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprintf("key-%d", i)
		if part.Partition(&kgo.Record{Key: []byte(k)}, partitions) == int(p) {
			out = append(out, k)
		}
	}
	return out
}

// A partition whose produce requests fail with a retriable error holds only its own records:
// the records of the other partition are acknowledged meanwhile, nothing is confirmed past
// the oldest transaction with a held record, and once the fault stops every record arrives
// in its key's order, without a new session.
func TestRetriableFailureHoldsOnlyItsPartition(t *testing.T) {
	t.Parallel()
	// Two brokers, one partition led by each: a produce request carries one partition.
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}, Partitions: 2,
		ClusterOpts: []kfake.Opt{kfake.NumBrokers(2)}})
	require.NoError(t, f.kafka.Cluster.MoveTopicPartition("orders", 0, 0))
	require.NoError(t, f.kafka.Cluster.MoveTopicPartition("orders", 1, 1))
	held, free := keysOf(0, 2, 3), keysOf(1, 2, 3)

	var failing atomic.Bool
	failing.Store(true)
	var refused atomic.Int64
	hit := make(chan struct{})
	var hitOnce sync.Once
	f.kafka.Cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.kafka.Cluster.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		if !failing.Load() || !slices.ContainsFunc(req.Topics, func(rt kmsg.ProduceRequestTopic) bool {
			return slices.ContainsFunc(rt.Partitions, func(p kmsg.ProduceRequestTopicPartition) bool { return p.Partition == 0 })
		}) {
			return nil, nil, false
		}
		refused.Add(1)
		hitOnce.Do(func() { close(hit) })
		return testenv.ProduceError(req, kerr.NotLeaderForPartition.Code), nil, true
	})

	var mu sync.Mutex
	var acked []string
	var heldEnd atomic.Uint64 // the end of the oldest transaction with a held record
	var passed []pglogrepl.LSN
	acks := &testenv.Progress{}
	commits := make(chan pglogrepl.LSN, 64)
	reports := make(chan pglogrepl.LSN, 64)
	e := f.newEngine(t, f.cfg, logmode.Hooks{
		OnAck: func(id string) {
			mu.Lock()
			acked = append(acked, id)
			mu.Unlock()
			acks.Add(1)
		},
		OnCommit: func(end pglogrepl.LSN) {
			select {
			case commits <- end:
			default: // a replay's, past the ones the test reads
			}
		},
		OnReport: func(pos pglogrepl.LSN) {
			if end := heldEnd.Load(); failing.Load() && end != 0 && uint64(pos) >= end {
				mu.Lock()
				passed = append(passed, pos)
				mu.Unlock()
			}
			select {
			case reports <- pos:
			default:
			}
		},
	})
	run(t, e)

	// Five transactions, each with a record of every key; the first holds held records.
	const txns = 5
	var heldIDs, freeIDs []string
	for i := range txns {
		var evs []event
		for j, k := range held {
			id := fmt.Sprintf("held-%d-%d", i, j)
			heldIDs = append(heldIDs, id)
			evs = append(evs, event{id: id, dest: "orders", key: k})
		}
		for j, k := range free {
			id := fmt.Sprintf("free-%d-%d", i, j)
			freeIDs = append(freeIDs, id)
			evs = append(evs, event{id: id, dest: "orders", key: k})
		}
		commitEvents(t, f.db.Pool, evs...)
		end := <-commits
		if i == 0 {
			heldEnd.Store(uint64(end))
		}
	}
	<-hit
	// Every record of the free partition is acknowledged while the held one fails.
	acks.Wait(t, int64(len(freeIDs)), time.Minute, nil)
	mu.Lock()
	require.ElementsMatch(t, freeIDs, acked, "only the free partition's records were acknowledged")
	mu.Unlock()
	// Past the producer's former retry budget, and past two more status updates.
	testenv.WaitFor(t, time.Minute, "the held partition refused many times", func() bool { return refused.Load() > 20 })
	for len(reports) > 0 {
		<-reports
	}
	<-reports
	<-reports
	require.True(t, failing.Load())
	mu.Lock()
	early := slices.Clone(passed)
	mu.Unlock()
	require.Empty(t, early, "no status update reached the end %s of the transaction with held records", pglogrepl.LSN(heldEnd.Load()))
	require.Less(t, slotConfirmedLSN(t, f), pglogrepl.LSN(heldEnd.Load()), "the slot's confirmed position")
	require.EqualValues(t, 1, e.Stats().Sessions, "the session went on")

	failing.Store(false)
	acks.Wait(t, int64(len(freeIDs)+len(heldIDs)), time.Minute, nil)
	require.EqualValues(t, 1, e.Stats().Sessions, "the session was never restarted")
	// Every record once, each key's in commit order.
	recs := f.kafka.Records(t, "orders")
	byKey := map[string][]string{}
	for i, id := range ids(recs) {
		byKey[string(recs[i].Key)] = append(byKey[string(recs[i].Key)], id)
	}
	for j, k := range held {
		var want []string
		for i := range txns {
			want = append(want, fmt.Sprintf("held-%d-%d", i, j))
		}
		require.Equal(t, want, byKey[k], "key %s", k)
	}
	for j, k := range free {
		var want []string
		for i := range txns {
			want = append(want, fmt.Sprintf("free-%d-%d", i, j))
		}
		require.Equal(t, want, byKey[k], "key %s", k)
	}
	testenv.WaitFor(t, time.Minute, "the slot confirms every transaction", func() bool {
		return slotConfirmedLSN(t, f) >= pglogrepl.LSN(heldEnd.Load())
	})
}
