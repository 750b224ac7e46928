package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestOrderUnderProduceFailuresAllPolicies: three relays drain one table while one produce
// request in three fails (UNKNOWN_SERVER_ERROR, which franz-go does not retry, so the relay
// sees the failures). Every key's sequence must be strictly increasing, and with no crash no
// message may appear twice.
func TestOrderUnderProduceFailuresAllPolicies(t *testing.T) {
	t.Parallel()
	for _, policy := range []outbox.Policy{outbox.PerKeyHeadOfLine, outbox.PerSourceStream, outbox.StopTheLine, outbox.BestEffort} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			db, kc, st := rig(t, 3)
			n := 1200
			if testing.Short() {
				n = 300
			}
			evs := keyedEvents("orders", n, 25)
			for i := 0; i < n; i += 300 {
				enqueue(t, db.Pool, st, evs[i:i+300]...)
			}
			f := injectFaults(kc)
			f.set(func(f *faults) { f.every, f.code = 3, kerr.UnknownServerError.Code })

			p := new(testenv.Progress)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var halts atomic.Int64
			errs := make(chan error, 3)
			for range 3 {
				client := kc.NewClient(t, outboxOpts()...)
				r, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{
					Schema: db.Schema, Policy: policy, BatchSize: 64, MaxAttempts: 1000,
					Backoff:      keiro.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
					PollInterval: 20 * time.Millisecond, OnBatch: onSettled(p), Logger: testLogger(t),
				})
				require.NoError(t, err)
				wg.Add(1)
				go func() { defer wg.Done(); errs <- runRestarting(ctx, r, &halts) }()
			}
			p.Wait(t, int64(n), 90*time.Second, nil)
			cancel()
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Positive(t, f.failed.Load(), "no failure was injected")
			if policy == outbox.StopTheLine {
				require.Positive(t, halts.Load(), "stop-the-line never halted")
			}
			recs := kc.ConsumeRecords(t, n, 30*time.Second, "orders")
			logFalseAcks(t, db, recs)
			distinct, dups := checkRecords(t, recs, policy != outbox.BestEffort)
			require.Equal(t, n, distinct)
			require.Zero(t, dups, "duplicates without a crash")
			var sent int
			require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM keiro_outbox WHERE status = 'sent'").Scan(&sent))
			require.Equal(t, n, sent)
		})
	}
}

// TestStopTheLineHaltsAndNamesTheRow: the first produce fails; Run returns ErrHalted naming the
// failed row, which is failed with an attempt used, while the rest of its batch is held back with
// attempts refunded.
func TestStopTheLineHaltsAndNamesTheRow(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	res := enqueue(t, db.Pool, st, keyedEvents("orders", 10, 3)...)
	f := injectFaults(kc)
	f.set(func(f *faults) { f.every, f.code = 1, kerr.UnknownServerError.Code })
	client := kc.NewClient(t, outboxOpts()...)
	r, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, Policy: outbox.StopTheLine, Logger: testLogger(t)})
	require.NoError(t, err)
	err = r.Run(context.Background())
	require.ErrorIs(t, err, outbox.ErrHalted)
	require.Contains(t, err.Error(), res[0].OutboxID.String())
	row, err := outbox.AdminOf(st).Lookup(context.Background(), db.Pool, res[0].OutboxID)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusFailed, row.Status)
	require.Equal(t, 1, row.Attempts)
	var skipped, attempts int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT count(*), max(attempt_count) FROM keiro_outbox WHERE last_error = 'skipped: earlier record for the same key failed'").Scan(&skipped, &attempts))
	require.Equal(t, 9, skipped)
	require.Zero(t, attempts)
}

// TestStopTheLinePublishesRowByRow: under StopTheLine each row is produced alone, in order, so
// a failed row stops the batch: no later row reaches Kafka, whatever its key or partition (one
// flush of many partitions would let the other partitions' records through).
func TestStopTheLinePublishesRowByRow(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 3)
	res := enqueue(t, db.Pool, st, keyedEvents("orders", 12, 12)...)
	var mu sync.Mutex
	var sizes []int // records per produce request
	kc.Cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		n := 0
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				var rb kmsg.RecordBatch
				if err := rb.ReadFrom(rp.Records); err == nil {
					n += int(rb.NumRecords)
				}
			}
		}
		mu.Lock()
		sizes = append(sizes, n)
		fail := len(sizes) == 4
		mu.Unlock()
		if !fail {
			return nil, nil, false
		}
		return produceError(req, kerr.UnknownServerError.Code), nil, true
	})
	client := kc.NewClient(t, outboxOpts()...)
	r, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, Policy: outbox.StopTheLine, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorIs(t, err, outbox.ErrHalted)
	require.Contains(t, err.Error(), res[3].OutboxID.String())
	mu.Lock()
	require.Equal(t, []int{1, 1, 1, 1}, sizes, "records per produce request")
	mu.Unlock()
	for i, rr := range res {
		row, err := outbox.AdminOf(st).Lookup(context.Background(), db.Pool, rr.OutboxID)
		require.NoError(t, err)
		switch {
		case i < 3:
			require.Equal(t, outbox.StatusSent, row.Status, "row %d", i)
		case i == 3:
			require.Equal(t, outbox.StatusFailed, row.Status)
			require.Equal(t, 1, row.Attempts)
		default:
			require.Equal(t, outbox.StatusFailed, row.Status, "row %d: %+v", i, row)
			require.Zero(t, row.Attempts, "row %d", i)
			require.Contains(t, row.LastError, "skipped", "row %d", i)
		}
	}
}

// logFalseAcks logs every sent row whose recorded (partition, offset) does not hold its own
// message on Kafka: an acknowledgement of a record that was never written there.
func logFalseAcks(t *testing.T, db *testenv.DB, recs []*kgo.Record) {
	t.Helper()
	at := map[[2]int64]string{}
	for _, r := range recs {
		at[[2]int64{int64(r.Partition), r.Offset}] = string(r.Value)
	}
	rows, err := db.Pool.Query(context.Background(),
		"SELECT message_id, convert_from(payload_bytes, 'UTF8'), kafka_partition, kafka_offset FROM keiro_outbox WHERE status = 'sent' ORDER BY seq")
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id, payload string
		var p, off int64
		require.NoError(t, rows.Scan(&id, &payload, &p, &off))
		if got := at[[2]int64{p, off}]; got != payload {
			t.Logf("FALSE ACK: %s %s recorded at p%d@%d, which holds %q", id, payload, p, off, got)
		}
	}
	require.NoError(t, rows.Err())
}

// TestOrderWhenTheFirstProduceToATopicFails: a fresh client holds records for a topic it has no
// metadata for aside and hands them to their partitions one by one once the metadata arrives;
// during a flush the first ones went out in one request while the rest were still being handed
// over. When that first request failed, the later records of the same keys went out in the next
// request and succeeded: Kafka had them before the failed ones (seen as "k8: 133 after 183" in
// the three-relay order test). The relay now produces the first row for a new topic alone.
func TestOrderWhenTheFirstProduceToATopicFails(t *testing.T) {
	t.Parallel()
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			db, kc, st := rig(t, 1)
			const n = 2000
			enqueue(t, db.Pool, st, keyedEvents("orders", n, 5)...)
			var requests atomic.Int64
			kc.Cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				kc.Cluster.KeepControl()
				if requests.Add(1) > 1 {
					return nil, nil, false
				}
				return produceError(req.(*kmsg.ProduceRequest), kerr.UnknownServerError.Code), nil, true
			})
			p := new(testenv.Progress)
			r, _ := startRelay(t, db, kc, outbox.RelayConfig{BatchSize: n, MaxAttempts: 100, OnBatch: onSettled(p),
				Backoff: keiro.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}, Logger: testLogger(t)})
			p.Wait(t, int64(n), 60*time.Second, nil)
			require.Positive(t, requests.Load())
			distinct, _ := checkOrder(t, kc.ConsumeRecords(t, n, 30*time.Second, "orders"))
			require.Equal(t, n, distinct)
			require.Zero(t, r.Stats().OrderBroken)
		})
	}
}

// TestKeySpanningTwoTopicsKeepsItsOrder: a key's rows alternate between two topics led by two
// brokers, and the first broker fails some produce requests (UNKNOWN_SERVER_ERROR, not retried
// by franz-go). Had a key's rows for both topics shared a flush, a failure on the first topic
// with a success on the second would put the key's later row on Kafka first (the relay's order
// detector fired). No key may have a row reach Kafka before an earlier row of its: every key's
// records, by enqueue order, have non-decreasing produce timestamps (a retried row is produced
// later than the rows that went out before it).
func TestKeySpanningTwoTopicsKeepsItsOrder(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := newKafka(t, kfake.NumBrokers(2))
	kc.CreateTopic(t, "ta", 1)
	kc.CreateTopic(t, "tb", 1)
	require.NoError(t, kc.Cluster.MoveTopicPartition("ta", 0, 0))
	require.NoError(t, kc.Cluster.MoveTopicPartition("tb", 0, 1))
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	const n, keys = 400, 8
	evs := make([]envelope.Event, n)
	for i := range evs {
		k := fmt.Sprintf("k%d", i%keys)
		topic := "ta"
		if (i/keys)%2 == 1 {
			topic = "tb"
		}
		evs[i] = event(fmt.Sprintf("m-%06d", i), topic, &k, fmt.Sprintf(`{"i":%d}`, i))
	}
	enqueue(t, db.Pool, st, evs...)
	taID := kc.Cluster.TopicInfo("ta").TopicID // produce v13 names topics by id
	// One request for "ta" in three fails, the first one excepted (the relay produces the
	// first record for a topic alone, until one gets through).
	var taReqs, failedReqs atomic.Int64
	kc.Cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		for _, tp := range req.Topics {
			if (tp.Topic == "ta" || tp.TopicID == taID) && taReqs.Add(1)%3 == 0 {
				failedReqs.Add(1)
				return produceError(req, kerr.UnknownServerError.Code), nil, true
			}
		}
		return nil, nil, false
	})
	p := new(testenv.Progress)
	r, _ := startRelayOpts(t, db, kc, outboxOpts(), outbox.RelayConfig{BatchSize: 64, MaxAttempts: 1000, OnBatch: onSettled(p),
		Backoff: keiro.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}, Logger: testLogger(t)})
	p.Wait(t, int64(n), 90*time.Second, nil)
	require.Positive(t, failedReqs.Load(), "no failure was injected")
	recs := kc.ConsumeRecords(t, n, 30*time.Second, "ta", "tb")
	require.Len(t, recs, n)
	type seen struct {
		i  int
		ts time.Time
	}
	byKey := map[string][]seen{}
	for _, rec := range recs {
		var i int
		_, err := fmt.Sscanf(string(rec.Value), `{"i":%d}`, &i)
		require.NoError(t, err)
		byKey[string(rec.Key)] = append(byKey[string(rec.Key)], seen{i, rec.Timestamp})
	}
	inversions := 0
	for k, s := range byKey {
		slices.SortFunc(s, func(a, b seen) int { return a.i - b.i })
		for j := 1; j < len(s); j++ {
			if s[j].ts.Before(s[j-1].ts) {
				inversions++
				t.Logf("%s: row %d reached Kafka before row %d", k, s[j].i, s[j-1].i)
			}
		}
	}
	require.Zero(t, inversions, "per-key inversions across the two topics")
	require.Zero(t, r.Stats().OrderBroken, "the relay's order detector fired")
}

// TestOrderWithSeveralRelaysOnOneBacklog: two and four relays split the claim shares, then
// drain one backlog together, each preferring its own shares: every row is published once and
// every key's rows reach Kafka in seq order, and the relays did claim from their own shares.
func TestOrderWithSeveralRelaysOnOneBacklog(t *testing.T) {
	t.Parallel()
	for _, relays := range []int{2, 4} {
		t.Run(fmt.Sprintf("relays=%d", relays), func(t *testing.T) {
			t.Parallel()
			db, kc, st := rig(t, 3)
			n := 6000
			if testing.Short() {
				n = 2000
			}
			p := new(testenv.Progress)
			rs := make([]*outbox.Relay, relays)
			for i := range rs {
				rs[i], _ = startRelay(t, db, kc, outbox.RelayConfig{BatchSize: 64, PollInterval: 20 * time.Millisecond,
					OnBatch: onSettled(p), Logger: testLogger(t)})
			}
			// Until the relays split the shares, the first holds them all (the only member).
			deadline := time.Now().Add(30 * time.Second)
			for {
				var sum int64
				split := true
				for _, r := range rs {
					s := r.Stats()
					sum += s.Shares
					split = split && s.ShareMembers == int64(relays) && s.Shares > 0
				}
				if split && sum == 64 {
					break
				}
				require.True(t, time.Now().Before(deadline), "the relays did not split the shares")
				time.Sleep(5 * time.Millisecond)
			}
			evs := keyedEvents("orders", n, 200)
			for i := 0; i < n; i += 1000 {
				enqueue(t, db.Pool, st, evs[i:i+1000]...)
			}
			p.Wait(t, int64(n), 90*time.Second, nil)
			recs := kc.ConsumeRecords(t, n, 30*time.Second, "orders")
			distinct, dups := checkOrder(t, recs)
			require.Equal(t, n, distinct)
			require.Zero(t, dups, "duplicates without a crash")
			var shareClaims int64
			for _, r := range rs {
				shareClaims += r.Stats().ShareClaims
				require.Zero(t, r.Stats().OrderBroken)
			}
			require.Positive(t, shareClaims, "no relay claimed from its own shares")
		})
	}
}
