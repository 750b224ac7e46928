package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
	"github.com/keiro-go/keiro/outbox"
)

// Parameters of the three-broker failure test.
const (
	clusterEvents     = 20000
	clusterKeys       = 200
	clusterBatch      = 500 // events per enqueue transaction
	clusterPartitions = 6
	clusterRelays     = 2
	clusterConsumers  = 3
)

// TestThreeBrokerFailures runs two relays and a consumer group of three processes against a
// real three-broker cluster (replication factor 3, min.insync.replicas=2) while 20k events over
// 200 keys flow, and fails the brokers one after another:
//
//  1. the broker leading every partition is SIGKILLed, then restarted;
//  2. the broker leading partition 0 is SIGSTOPped until the controller fences it (past
//     broker.session.timeout.ms) and its partitions are led elsewhere, then continued;
//  3. two brokers are killed: acks=all can no longer be met (NOT_ENOUGH_REPLICAS), rows wait
//     without using attempts, none goes dead, and the oldest-pending age that the lag alert
//     reads grows; then both are restarted.
//
// Every phase moves on when something happened (rows published, leaders moved, an error
// seen), never after a fixed time. At the end: every event applied once, in per-key order, on
// the topic and in the effects; no outbox row left unsent.
func TestThreeBrokerFailures(t *testing.T) {
	ctx := context.Background()
	c, err := kafkabroker.Start(ctx, kafkabroker.Config{Brokers: 3,
		Props: map[string]string{"auto.create.topics.enable": "false"}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true, Brokers: c.Seeds()})
	topic, group := kc.Topic("e2e.replicated.v1"), kc.Group("replicated")
	createLedBy(t, kc, topic, clusterPartitions, 1)
	kc.CreateTopic(t, topic+".dlq", 1)

	db := testenv.NewDB(t)
	effectsFixture(t, db)
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)

	relayEnvs := relayEnv(db, kc, "KEIRO_RELAY_LEASE=30s", "KEIRO_RELAY_MAX_ATTEMPTS=5")
	consumerEnvs := consumerEnv(db, kc, group, topic, "KEIRO_CONSUMER_LOG_LEVEL=warn",
		"KEIRO_CONSUMER_SESSION_TIMEOUT="+chaosSessionTimeout.String(),
		"KEIRO_CONSUMER_REBALANCE_TIMEOUT="+chaosRebalanceTimeout.String())
	var relays []*proc
	for i := range clusterRelays {
		relays = append(relays, startProc(t, fmt.Sprintf("relay-%d", i), relayBin, relayAddrRe, relayEnvs))
	}
	for i := range clusterConsumers {
		startProc(t, fmt.Sprintf("consumer-%d", i), consumerBin, consumerAddrRe, consumerEnvs)
	}
	var relayAddrs []string
	for _, r := range relays {
		relayAddrs = append(relayAddrs, r.waitAddr(t, 30*time.Second))
	}
	// oldestPendingAge is the gauge as the alert rules read it, the maximum over the relays: only
	// a relay whose latest maintenance pass sampled the outbox (under the maintenance lock)
	// exports it, the others export no series (read as 0 here), so which relay samples changes
	// nothing.
	oldestPendingAge := func() float64 {
		var age float64
		for _, addr := range relayAddrs {
			age = max(age, gauge(t, addr, "keiro_outbox_oldest_pending_age_seconds"))
		}
		return age
	}

	// The events: key k's events are numbered 1, 2, 3, … in commit order.
	want := map[string]int64{}
	var enqueued atomic.Int64
	enqueueN := func(n int) {
		t.Helper()
		for range n / clusterBatch {
			evs := make([]envelope.Event, 0, clusterBatch)
			for range clusterBatch {
				i := enqueued.Add(1) - 1
				key := fmt.Sprintf("key-%03d", i%clusterKeys)
				want[key]++
				evs = append(evs, keyedEvent(topic, key, want[key]))
			}
			require.NoError(t, enqueue(ctx, db.Pool, ob, evs...))
		}
	}
	sent := func() int64 {
		var n int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_outbox WHERE status = 'sent'`).Scan(&n))
		return n
	}
	waitSent := func(what string) {
		t.Helper()
		n := enqueued.Load()
		testenv.WaitFor(t, 3*time.Minute, what, func() bool { return sent() >= n })
	}
	logs := func() string {
		var b strings.Builder
		for _, n := range append(c.Brokers, c.Controller) {
			fmt.Fprintf(&b, "--- node %d: %s\n", n.ID, n.LogPath())
		}
		for _, r := range relays {
			fmt.Fprintf(&b, "--- %s\n%s\n", r.name, tail(r.log(), 20))
		}
		return b.String()
	}

	// 1. The leader of every partition is SIGKILLed: leadership moves, rows keep flowing with
	// two in-sync replicas; then it comes back.
	enqueueN(4000)
	waitSent("the first rows published on three brokers")
	require.NoError(t, c.Broker(1).Kill())
	enqueueN(4000)
	waitSent("rows published with the leader killed")
	require.NotContains(t, leaders(t, kc, topic), int32(1), "leadership moved off the killed broker")
	require.NoError(t, c.Broker(1).Restart(ctx))

	// 2. The broker leading partition 0 stops answering; the controller fences it once its
	// session times out and other brokers lead its partitions.
	paused := c.Broker(leaders(t, kc, topic)[0])
	require.NoError(t, paused.Pause())
	enqueueN(4000)
	testenv.WaitFor(t, 2*time.Minute, "the paused broker's partitions led elsewhere", func() bool {
		return !slices.Contains(leaders(t, kc, topic), paused.ID)
	})
	waitSent("rows published with a broker paused past its session")
	require.NoError(t, paused.Resume())
	require.NoError(t, c.WaitReady(ctx))

	// 3. Two brokers down: the partitions' one in-sync replica is below min.insync.replicas.
	// The rows wait, with no attempt used and none dead, and their age grows.
	survivor := c.Broker(3)
	for _, id := range []int32{1, 2} {
		require.NoError(t, c.Broker(id).Kill())
	}
	var fence int64 // the outbox's last row before the rows of this phase
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM `+db.Schema+`.keiro_outbox`).Scan(&fence))
	enqueueN(4000)
	// The relay's produce cannot complete: the idempotent producer keeps retrying a batch it
	// may have sent (NOT_ENOUGH_REPLICAS, or no answer from a dead leader) rather than give up
	// on it, so the rows stay publishing, the rows behind them pending, and their age grows —
	// the gauge KeiroOutboxOldestPendingHigh reads. Wait until it is past the controller's
	// fencing of the dead brokers (broker.session.timeout.ms, 9 s).
	testenv.WaitFor(t, 3*time.Minute, "the oldest pending age past the brokers' session timeout", func() bool {
		return oldestPendingAge() >= 15
	})
	var dead, attempted int64
	var published int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status IN ('dead', 'rejected')),
	    count(*) FILTER (WHERE attempt_count > 0 AND status <> 'sent'), count(*) FILTER (WHERE status = 'sent' AND seq > $1)
	    FROM `+db.Schema+`.keiro_outbox`, fence).Scan(&dead, &attempted, &published))
	require.Zero(t, dead, "no row goes dead or rejected while the cluster is below min.insync.replicas")
	age1 := oldestPendingAge()
	// The gauge moves at maintenance passes (every 30 s, by whichever relay takes the lock):
	// allow several, as above.
	testenv.WaitFor(t, 3*time.Minute, "the oldest pending age to keep growing", func() bool {
		return oldestPendingAge() > age1
	})
	var publishing int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_outbox WHERE status = 'publishing'`).Scan(&publishing))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_outbox WHERE status = 'sent' AND seq > $1`, fence).Scan(&published))
	require.Zero(t, published, "nothing enqueued below min.insync.replicas is published\n%s", logs())
	t.Logf("below min.insync.replicas: 4000 rows waiting (%d publishing), %d rows with an attempt recorded; oldest pending age rising from %.1fs",
		publishing, attempted, age1)
	for _, id := range []int32{1, 2} {
		require.NoError(t, c.Broker(id).Restart(ctx))
	}
	require.True(t, survivor.Running())
	require.NoError(t, c.WaitReady(ctx))
	enqueueN(clusterEvents - int(enqueued.Load()))
	waitSent("every row published once the cluster has its replicas back")

	// Drained: every effect applied and every offset committed.
	adm := kadm.NewClient(kc.Client)
	testenv.WaitFor(t, 3*time.Minute, "every effect applied and every offset committed", func() bool {
		var n int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.effects`).Scan(&n))
		return n >= clusterEvents && committedAll(ctx, adm, group, topic)
	})

	o := readOutcome(t, db, kc, topic, want)
	recs := consumeAll(t, kc, int(o.topicRecords), time.Minute, topic)
	require.Len(t, recs, int(o.topicRecords))
	fmt.Printf("three brokers: %d events, %d records on the topic (%d duplicates published), %d effects (%d distinct), "+
		"%d per-key inversions in the effects, %d on the topic, outbox %v\n",
		clusterEvents, o.topicRecords, o.topicRecords-clusterEvents, o.effects, o.distinct,
		len(o.orderViolations), len(keyInversions(recs)), o.outboxByStatus)
	require.Equal(t, int64(clusterEvents), o.effects, "every event applied once")
	require.Equal(t, int64(clusterEvents), o.distinct)
	require.Empty(t, o.orderViolations, "per-key order of the effects")
	require.Empty(t, keyInversions(recs), "per-key order on the topic")
	require.Zero(t, o.outboxNotSent, "%v", o.outboxByStatus)
	require.Zero(t, o.inboxNotCompleted)
}

// createLedBy creates topic with every partition's replicas on brokers 1, 2 and 3, leader
// first.
func createLedBy(t *testing.T, kc *testenv.Kafka, topic string, partitions int32, leader int32) {
	t.Helper()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, -1, -1
	replicas := []int32{leader}
	for id := int32(1); id <= 3; id++ {
		if id != leader {
			replicas = append(replicas, id)
		}
	}
	for p := range partitions {
		ra := kmsg.NewCreateTopicsRequestTopicReplicaAssignment()
		ra.Partition, ra.Replicas = p, replicas
		rt.ReplicaAssignment = append(rt.ReplicaAssignment, ra)
	}
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 30000
	resp, err := req.RequestWith(context.Background(), kc.Client)
	require.NoError(t, err)
	for _, tr := range resp.Topics {
		require.Zero(t, tr.ErrorCode, "create %s: %v", topic, deref(tr.ErrorMessage))
	}
	require.Eventually(t, func() bool { ls := leaders(t, kc, topic); return len(ls) == int(partitions) && ls[0] == leader },
		30*time.Second, 100*time.Millisecond)
}

// leaders returns the leader of each of topic's partitions (by partition), as the cluster's
// metadata says now; -1 for a partition without one.
func leaders(t *testing.T, kc *testenv.Kafka, topic string) []int32 {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, kc.Client)
	if err != nil || len(resp.Topics) != 1 {
		return nil
	}
	out := make([]int32, len(resp.Topics[0].Partitions))
	for _, p := range resp.Topics[0].Partitions {
		if int(p.Partition) < len(out) {
			out[p.Partition] = p.Leader
		}
	}
	return out
}

// gauge reads one gauge (the sum of its series) from the /metrics page at addr.
func gauge(t *testing.T, addr, name string) float64 {
	t.Helper()
	v, err := metric(addr, name)
	require.NoError(t, err)
	return v
}
