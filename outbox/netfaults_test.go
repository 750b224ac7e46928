package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
	"github.com/keiro-go/keiro/keirotest/testenv/netproxy"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// Network faults between the relay and its two peers, on a real broker and a real PostgreSQL,
// each reached through a proxy of its own (keirotest/testenv/netproxy) that adds 1ms each way.
// Every fault is injected on an event of the relay (a claim starts, a mark is sent, a record is
// handed to or acknowledged by the producer, a lease is renewed) and removed on the next one;
// each case then checks that every event is on the topic (0 lost) and that each key's first
// copies are in enqueue order (0 reordered), duplicates only where at least once allows them.
const (
	netEvents   = 400
	netKeys     = 100
	netBatch    = 20
	netLease    = time.Second // the shortest lease: a fault past it costs a second
	netDeadline = 90 * time.Second
)

// netRig is one case's network: a PostgreSQL proxy of its own in front of a schema of its own,
// and the brokers' proxies shared by the cases (which run one at a time).
type netRig struct {
	db    *testenv.DB
	kc    *testenv.Kafka // the test's own view of the broker, direct: faults do not touch it
	kafka *netproxy.Kafka
	pg    *netproxy.Proxy
	st    *outbox.Store
	topic string
}

// relayPool opens a pool to the rig's schema through a PostgreSQL proxy.
func (n *netRig) relayPool(t *testing.T, pg *netproxy.Proxy) *pgxpool.Pool {
	t.Helper()
	url, err := pg.RewriteURL(n.db.ConnString)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Connect 8 now, so that a fault injected as a statement starts finds it on a connection
	// already open rather than on one being opened (which would fail before sending it).
	var conns []*pgxpool.Conn
	for range 8 {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return pool
}

// relayClient is a relay's Kafka client through the brokers' proxies.
func (n *netRig) relayClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(n.kafka.Seeds()...)}, outboxOpts()...), opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// netConfig is the relays' configuration in these cases: small batches, the shortest lease,
// fast polls and retries.
func netConfig(t *testing.T) outbox.RelayConfig {
	return outbox.RelayConfig{BatchSize: netBatch, Lease: netLease, PollInterval: 50 * time.Millisecond,
		Backoff: keiro.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}, MaxAttempts: 100,
		Logger: testLogger(t)}
}

// newNetRelay builds a relay of the rig's schema on pool and client; prepare (if set) installs
// its hooks before it runs until the test ends.
func (n *netRig) newNetRelay(t *testing.T, pool *pgxpool.Pool, client *kgo.Client, cfg outbox.RelayConfig, prepare func(*outbox.Relay)) *outbox.Relay {
	t.Helper()
	cfg.Schema = n.db.Schema
	r, err := outbox.NewRelay(pool, client, cfg)
	require.NoError(t, err)
	if prepare != nil {
		prepare(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
	})
	return r
}

// waitSent waits until every row of keiro_outbox is sent (marks whose reply was lost report no
// transition, so the table, not OnBatch, is the measure).
func (n *netRig) waitSent(t *testing.T, want int) {
	t.Helper()
	testenv.WaitFor(t, netDeadline, fmt.Sprintf("%d rows sent", want), func() bool {
		var sent int
		require.NoError(t, n.db.Pool.QueryRow(context.Background(),
			"SELECT count(*) FROM keiro_outbox WHERE status = 'sent'").Scan(&sent))
		return sent >= want
	})
}

// records reads every record of the rig's topic, up to its end offsets.
func (n *netRig) records(t *testing.T) []*kgo.Record {
	t.Helper()
	ends, err := kadm.NewClient(n.kc.Client).ListEndOffsets(context.Background(), n.topic)
	require.NoError(t, err)
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	recs := n.kc.ConsumeRecords(t, int(total), 30*time.Second, n.topic)
	require.GreaterOrEqual(t, len(recs), int(total), "the records up to the end offsets")
	return recs
}

// checkAll checks that the topic holds every one of want events (0 lost) with each key's first
// copies in order (0 reordered), and returns the duplicates.
func (n *netRig) checkAll(t *testing.T, want int) int {
	t.Helper()
	distinct, dups := checkOrder(t, n.records(t))
	require.Equal(t, want, distinct, "every event on the topic")
	t.Logf("%d events on the topic, %d duplicates", distinct, dups)
	return dups
}

// TestNetworkFaults runs the relay, in claim mode and in log mode, through proxies that fail
// the network under it: PostgreSQL connections reset mid-claim and mid-mark (claim mode) or
// mid-stream and mid-confirm (log mode), a latency spike past the lease with a second relay
// taking over, the broker blackholed and then its bandwidth cut to a trickle. The cases share
// one real broker, behind a proxy it advertises, and run one after the other.
func TestNetworkFaults(t *testing.T) {
	t.Parallel()
	srv := netproxy.New(t)
	kafka := netproxy.StartKafka(t, srv, kafkabroker.Config{Props: map[string]string{"auto.create.topics.enable": "false"}},
		netproxy.ProxyConfig{})
	kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true, Brokers: kafka.Cluster.Seeds()})
	setup := func(t *testing.T) *netRig {
		t.Helper()
		db := testenv.NewDB(t)
		st, err := outbox.NewStore(db.Schema)
		require.NoError(t, err)
		n := &netRig{db: db, kc: kc, kafka: kafka, st: st, topic: kc.Topic(fmt.Sprintf("net.%s", db.Schema))}
		kc.CreateTopic(t, n.topic, 4)
		n.pg = srv.Proxy(t, netproxy.ProxyConfig{Upstream: pgAddr(t, db)})
		dumpOutboxOnFailure(t, db)
		return n
	}

	t.Run("advertised", func(t *testing.T) { testAdvertisedThroughProxy(t, setup(t)) })
	t.Run("claim/pg-reset-mid-claim", func(t *testing.T) { testResetMidClaim(t, setup(t)) })
	t.Run("claim/pg-reset-mid-mark", func(t *testing.T) { testResetMidMark(t, setup(t)) })
	t.Run("claim/latency-past-lease", func(t *testing.T) { testLatencyPastLease(t, setup(t), srv) })
	t.Run("claim/broker-blackholed", func(t *testing.T) { testBrokerFault(t, setup(t), outbox.ModeClaim, netproxy.Blackhole()) })
	t.Run("claim/broker-trickle", func(t *testing.T) { testBrokerFault(t, setup(t), outbox.ModeClaim, netproxy.Bandwidth(2)) })
	t.Run("claim/broker-reset-mid-produce", func(t *testing.T) { testBrokerResetMidProduce(t, setup(t), outbox.ModeClaim) })
	t.Run("log/pg-reset-mid-stream", func(t *testing.T) { testLogReset(t, setup(t), false) })
	t.Run("log/pg-reset-mid-confirm", func(t *testing.T) { testLogReset(t, setup(t), true) })
	t.Run("log/broker-blackholed", func(t *testing.T) { testBrokerFault(t, setup(t), outbox.ModeLog, netproxy.Blackhole()) })
	t.Run("log/broker-trickle", func(t *testing.T) { testBrokerFault(t, setup(t), outbox.ModeLog, netproxy.Bandwidth(2)) })
	t.Run("log/broker-reset-mid-produce", func(t *testing.T) { testBrokerResetMidProduce(t, setup(t), outbox.ModeLog) })
}

// pgAddr is the host:port of the test database.
func pgAddr(t *testing.T, db *testenv.DB) string {
	t.Helper()
	cc := db.Pool.Config().ConnConfig
	return fmt.Sprintf("%s:%d", cc.Host, cc.Port)
}

// testAdvertisedThroughProxy: the broker's metadata sends a client seeded with the proxy back
// to the proxy, so every request of the relay's client crosses it.
func testAdvertisedThroughProxy(t *testing.T, n *netRig) {
	cl := n.relayClient(t)
	meta, err := kadm.NewClient(cl).BrokerMetadata(context.Background())
	require.NoError(t, err)
	require.Len(t, meta.Brokers, 1)
	require.Equal(t, n.kafka.Proxies[0].Addr(), fmt.Sprintf("%s:%d", meta.Brokers[0].Host, meta.Brokers[0].Port))
	require.NotEqual(t, n.kafka.Cluster.Brokers[0].Addr, n.kafka.Proxies[0].Addr())
}

// testResetMidClaim: at the relay's third claim, every PostgreSQL connection of the relay is
// reset at its next reply, so the claim commits and its reply is lost; the fault is removed at
// the next claim. The relay must learn of the lost claim's rows (released once its backend is
// gone, or reclaimed after the lease) and publish every event once in order.
func testResetMidClaim(t *testing.T, n *netRig) {
	enqueue(t, n.db.Pool, n.st, keyedEvents(n.topic, netEvents, netKeys)...)
	var calls atomic.Int64
	var fault *netproxy.Toxic
	var mu sync.Mutex
	r := n.newNetRelay(t, n.relayPool(t, n.pg), n.relayClient(t), netConfig(t), func(r *outbox.Relay) {
		outbox.OnClaim(r, func() {
			mu.Lock()
			defer mu.Unlock()
			switch calls.Add(1) {
			case 3:
				var err error
				fault, err = n.pg.Inject(netproxy.ResetPeer(0).Toward(netproxy.Downstream))
				if err != nil {
					t.Errorf("inject: %v", err)
				}
			case 4:
				if err := fault.Remove(); err != nil {
					t.Errorf("remove: %v", err)
				}
			}
		})
	})
	n.waitSent(t, netEvents)
	s := r.Stats()
	t.Logf("claims %d, claim errors %d, mark errors %d, released %d, reclaimed %d", s.Claims, s.ClaimErrors, s.MarkErrors, s.Released, s.Reclaimed)
	require.Positive(t, s.ClaimErrors, "the claim's reply was lost")
	require.Positive(t, s.Released+s.Reclaimed, "the lost claim's rows came back to the relay")
	n.checkAll(t, netEvents)
}

// testResetMidMark: at a batch's mark, every PostgreSQL connection of the relay is reset at its
// next reply (the mark commits, its reply is lost) and, at a later mark, at its next query (the
// mark never arrives); each fault is removed at the mark after it. The relay retries the marks
// (fenced by the claim token: the retry of one that committed changes nothing) and publishes
// every event in order; a mark that never arrived leaves its rows to be published again after
// the lease, which at least once allows.
func testResetMidMark(t *testing.T, n *netRig) {
	enqueue(t, n.db.Pool, n.st, keyedEvents(n.topic, netEvents, netKeys)...)
	var calls atomic.Int64
	var fault *netproxy.Toxic
	var mu sync.Mutex
	r := n.newNetRelay(t, n.relayPool(t, n.pg), n.relayClient(t), netConfig(t), func(r *outbox.Relay) {
		outbox.OnMark(r, func() {
			mu.Lock()
			defer mu.Unlock()
			var f netproxy.Fault
			switch calls.Add(1) {
			case 2:
				f = netproxy.ResetPeer(0).Toward(netproxy.Downstream)
			case 6:
				f = netproxy.LimitData(0).Toward(netproxy.Upstream)
			case 3, 7:
				if err := fault.Remove(); err != nil {
					t.Errorf("remove: %v", err)
				}
				return
			default:
				return
			}
			var err error
			if fault, err = n.pg.Inject(f); err != nil {
				t.Errorf("inject: %v", err)
			}
		})
	})
	n.waitSent(t, netEvents)
	s := r.Stats()
	t.Logf("batches %d, mark errors %d, reclaimed %d", s.Batches, s.MarkErrors, s.Reclaimed)
	require.GreaterOrEqual(t, calls.Load(), int64(7), "both faults were injected and removed")
	require.GreaterOrEqual(t, s.MarkErrors, int64(2), "both marks failed")
	dups := n.checkAll(t, netEvents)
	require.LessOrEqual(t, dups, 2*netBatch, "only the rows of the marks that failed are published twice")
}

// testLatencyPastLease: relay A's PostgreSQL link slows down to 3 × the lease each way as its
// first batch is marked; relay B, on a link of its own, takes A's expired rows over. The spike
// ends once B reclaimed rows. A's late mark and renewals are fenced; every event is published,
// each key's first copies in order, and the only duplicates are A's rows that B took over.
func testLatencyPastLease(t *testing.T, n *netRig, srv *netproxy.Server) {
	enqueue(t, n.db.Pool, n.st, keyedEvents(n.topic, netEvents, netKeys)...)
	spiked := make(chan *netproxy.Toxic, 1)
	var marks atomic.Int64
	cfgA := netConfig(t)
	cfgA.MaxInFlightBatches = 1
	a := n.newNetRelay(t, n.relayPool(t, n.pg), n.relayClient(t), cfgA, func(r *outbox.Relay) {
		outbox.OnMark(r, func() {
			if marks.Add(1) != 1 {
				return
			}
			x, err := n.pg.Inject(netproxy.Latency(3*netLease, 0))
			if err != nil {
				t.Errorf("inject: %v", err)
			}
			spiked <- x
		})
	})
	spike := <-spiked
	defer func() { _ = spike.Remove() }()
	pgB := srv.Proxy(t, netproxy.ProxyConfig{Upstream: n.pg.Upstream()})
	var reclaimed atomic.Int64
	took := make(chan struct{})
	cfgB := netConfig(t)
	cfgB.OnBatch = func(b outbox.BatchResult) {
		if b.Reclaimed > 0 && reclaimed.Add(int64(b.Reclaimed)) == int64(b.Reclaimed) {
			close(took)
		}
	}
	n.newNetRelay(t, n.relayPool(t, pgB), n.relayClient(t), cfgB, nil)
	select {
	case <-took:
	case <-time.After(netDeadline):
		t.Fatal("relay B never took over relay A's rows")
	}
	require.NoError(t, spike.Remove())
	n.waitSent(t, netEvents)
	t.Logf("relay B reclaimed %d rows; relay A: %+v", reclaimed.Load(), a.Stats())
	dups := n.checkAll(t, netEvents)
	require.LessOrEqual(t, dups, int(reclaimed.Load()), "only rows taken over are published twice")
}

// testBrokerFault: the broker becomes unreachable behind fault (a blackhole: nothing through,
// connections kept; or a trickle of 2 KB/s) while the relay publishes, and half the events are
// committed meanwhile. The fault lasts until the relay has shown it held on through it: its
// producer was handed every event and wrote to the broker through the fault, and a claim relay
// renewed the lease of a batch the broker held up. Through a blackhole no record is
// acknowledged; through the trickle some are. Once the network is restored every event reaches
// the topic, each key in order.
func testBrokerFault(t *testing.T, n *netRig, mode outbox.Mode, fault netproxy.Fault) {
	evs := keyedEvents(n.topic, netEvents, netKeys)
	cfg := netConfig(t)
	var writes, buffered, acked atomic.Int64
	client := n.relayClient(t, kgo.WithHooks(brokerWrites(func() { writes.Add(1) }), netHooks{
		buffered: func(*kgo.Record) { buffered.Add(1) },
		acked: func(_ *kgo.Record, err error) {
			if err == nil {
				acked.Add(1)
			}
		},
	}))
	pool := n.relayPool(t, n.pg)
	var r *outbox.Relay
	if mode == outbox.ModeLog {
		dropLogSlot(t, n.db.Pool, outbox.DefaultLogSlot(n.db.Schema))
		cfg.Mode, cfg.LogEngine = outbox.ModeLog, logrelay.Engine
		r = n.newNetRelay(t, pool, client, cfg, nil)
		waitReplicating(t, n, r)
	} else {
		r = n.newNetRelay(t, pool, client, cfg, nil)
	}
	enqueue(t, n.db.Pool, n.st, evs[:netEvents/2]...)
	waitOnTopic(t, n, netEvents/2)
	testenv.WaitFor(t, netDeadline, "the first half acknowledged", func() bool { return acked.Load() >= netEvents/2 })

	x := n.kafka.Proxies[0].MustInject(t, fault)
	blackhole := fault.Type == netproxy.Blackhole().Type
	before, writesBefore, ackedBefore := r.Stats(), writes.Load(), acked.Load()
	for i := netEvents / 2; i < netEvents; i += 50 {
		enqueue(t, n.db.Pool, n.st, evs[i:i+50]...)
	}
	testenv.WaitFor(t, netDeadline, "the relay holding on through the fault", func() bool {
		held := buffered.Load() >= netEvents && writes.Load() > writesBefore
		if mode == outbox.ModeClaim {
			// A claim relay has at most MaxInFlightBatches batches in the producer: the
			// renewal of one the broker holds up is its sign.
			held = writes.Load() > writesBefore && r.Stats().LeaseRenewals > before.LeaseRenewals
		}
		if !blackhole {
			held = held && acked.Load() > ackedBefore // the trickle lets records through
		}
		return held
	})
	if blackhole {
		require.Equal(t, ackedBefore, acked.Load(), "no record acknowledged through the blackhole")
	}
	require.NoError(t, x.Remove())
	waitOnTopic(t, n, netEvents)
	if mode == outbox.ModeClaim {
		n.waitSent(t, netEvents)
	}
	t.Logf("relay: %+v; records acknowledged during the fault %d", r.Stats(), acked.Load()-ackedBefore)
	n.checkAll(t, netEvents)
}

// testBrokerResetMidProduce: once half the events are on the topic, the next produce request
// the relay's producer writes arms a reset of the broker's connections at their next reply, so
// the request lands and its response is lost; the fault is removed as soon as the producer read
// the loss. The idempotent producer retries the request on a new connection with the same
// sequence numbers and the broker recognises it: every event once, each key in order, no
// duplicate.
func testBrokerResetMidProduce(t *testing.T, n *netRig, mode outbox.Mode) {
	var armed atomic.Bool
	var writes, failed atomic.Int64
	var mu sync.Mutex
	var fault *netproxy.Toxic
	client := n.relayClient(t, kgo.WithHooks(brokerWrites(func() {
		writes.Add(1)
		if !armed.CompareAndSwap(true, false) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		var err error
		if fault, err = n.kafka.Proxies[0].Inject(netproxy.ResetPeer(0).Toward(netproxy.Downstream)); err != nil {
			t.Errorf("inject: %v", err)
		}
	}), brokerReads(func() {
		mu.Lock()
		defer mu.Unlock()
		if failed.Add(1) == 1 && fault != nil {
			if err := fault.Remove(); err != nil {
				t.Errorf("remove: %v", err)
			}
		}
	})))
	cfg := netConfig(t)
	pool := n.relayPool(t, n.pg)
	evs := keyedEvents(n.topic, netEvents, netKeys)
	if mode == outbox.ModeLog {
		dropLogSlot(t, n.db.Pool, outbox.DefaultLogSlot(n.db.Schema))
		cfg.Mode, cfg.LogEngine = outbox.ModeLog, logrelay.Engine
		waitReplicating(t, n, n.newNetRelay(t, pool, client, cfg, nil))
	} else {
		n.newNetRelay(t, pool, client, cfg, nil)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("produce requests written %d, produce responses lost %d", writes.Load(), failed.Load())
		}
	})
	enqueue(t, n.db.Pool, n.st, evs[:netEvents/2]...)
	waitOnTopic(t, n, netEvents/2)
	armed.Store(true)
	for i := netEvents / 2; i < netEvents; i += netBatch {
		enqueue(t, n.db.Pool, n.st, evs[i:i+netBatch]...)
	}
	waitOnTopic(t, n, netEvents)
	if mode == outbox.ModeClaim {
		n.waitSent(t, netEvents)
	}
	require.Positive(t, failed.Load(), "a produce response was lost to the reset")
	require.Zero(t, n.checkAll(t, netEvents), "the idempotent producer's retry is not a duplicate")
}

// brokerReads is a kgo hook calling f after each failed read of a produce response.
type brokerReads func()

func (f brokerReads) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err != nil {
		f()
	}
}

// waitOnTopic waits until the topic holds at least want distinct events (the end offsets, then
// the records, tell).
func waitOnTopic(t *testing.T, n *netRig, want int) {
	t.Helper()
	testenv.WaitFor(t, netDeadline, fmt.Sprintf("%d events on the topic", want), func() bool {
		ends, err := kadm.NewClient(n.kc.Client).ListEndOffsets(context.Background(), n.topic)
		if err != nil {
			return false
		}
		var total int64
		ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
		if total < int64(want) {
			return false
		}
		distinct, _ := checkOrder(t, n.records(t))
		return distinct >= want
	})
}

// waitReplicating waits until the log-mode relay r switched the schema and replicates.
func waitReplicating(t *testing.T, n *netRig, r *outbox.Relay) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() && outbox.LogSessions(r) == 0 {
			logOldTransactions(t, n.db.Pool)
		}
	})
	testenv.WaitFor(t, netDeadline, "the log-mode relay replicating", func() bool {
		m, err := outbox.AdminOf(n.st).Mode(context.Background(), n.db.Pool)
		return err == nil && m == outbox.ModeLog && outbox.LogSessions(r) >= 1
	})
}

// logOldTransactions logs the server's oldest open transactions: creating a replication slot
// waits for every transaction that was running when it started, anywhere on the server, so a
// session left idle in a transaction (by any client of the server) holds a log-mode relay back.
func logOldTransactions(t *testing.T, pool *pgxpool.Pool) {
	rows, err := pool.Query(context.Background(), `SELECT pid, state, now() - xact_start, left(query, 100)
		FROM pg_stat_activity WHERE backend_xid IS NOT NULL ORDER BY xact_start LIMIT 5`)
	if err != nil {
		t.Logf("list open transactions: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var pid int32
		var state, query string
		var age time.Duration
		if rows.Scan(&pid, &state, &age, &query) == nil {
			t.Logf("open transaction: pid %d %s for %s: %s", pid, state, age, query)
		}
	}
}

// slotPID returns the pid of the session reading the slot, 0 when none does.
func slotPID(t *testing.T, n *netRig) int {
	t.Helper()
	var pid *int32
	err := n.db.Pool.QueryRow(context.Background(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`,
		outbox.DefaultLogSlot(n.db.Schema)).Scan(&pid)
	require.NoError(t, err)
	if pid == nil {
		return 0
	}
	return int(*pid)
}

// testLogReset: a log-mode relay streams one transaction of many events. When the producer
// is handed the transaction's first record (atConfirm false) or Kafka acknowledges its last
// (atConfirm true), the relay's PostgreSQL connections are cut at their next byte either way
// (atConfirm: the way up only, where the confirm of the transaction goes), and the fault is
// removed once the slot's session is gone. The next session replays the transaction from the
// slot's confirmed position: every event is on the topic, each key in order, and the replayed
// records are the only duplicates.
func testLogReset(t *testing.T, n *netRig, atConfirm bool) {
	dropLogSlot(t, n.db.Pool, outbox.DefaultLogSlot(n.db.Schema))
	evs := keyedEvents(n.topic, netEvents, netKeys)
	last := evs[len(evs)-1].MessageID
	var armed atomic.Bool
	faults := make(chan *netproxy.Toxic, 1)
	inject := func(f netproxy.Fault) {
		x, err := n.pg.Inject(f)
		if err != nil {
			t.Errorf("inject: %v", err)
		}
		faults <- x
	}
	hooks := netHooks{
		buffered: func(r *kgo.Record) {
			if !atConfirm && armed.CompareAndSwap(false, true) {
				inject(netproxy.LimitData(0))
			}
		},
		acked: func(r *kgo.Record, err error) {
			if atConfirm && err == nil && messageID(r) == last && armed.CompareAndSwap(false, true) {
				inject(netproxy.LimitData(0).Toward(netproxy.Upstream))
			}
		},
	}
	cfg := netConfig(t)
	cfg.Mode, cfg.LogEngine = outbox.ModeLog, logrelay.Engine
	r := n.newNetRelay(t, n.relayPool(t, n.pg), n.relayClient(t, kgo.WithHooks(hooks)), cfg, nil)
	waitReplicating(t, n, r)
	pid := slotPID(t, n)
	require.NotZero(t, pid)
	enqueue(t, n.db.Pool, n.st, evs...) // one transaction
	var x *netproxy.Toxic
	select {
	case x = <-faults:
	case <-time.After(netDeadline):
		t.Fatal("the relay never produced the transaction's records")
	}
	testenv.WaitFor(t, netDeadline, "the slot's session to end", func() bool { return slotPID(t, n) != pid })
	require.NoError(t, x.Remove())
	waitOnTopic(t, n, netEvents)
	testenv.WaitFor(t, netDeadline, "a new replication session", func() bool { return outbox.LogSessions(r) >= 2 })
	// Whether records produced before the cut are on the topic twice depends on whether the
	// session's last status report left before the cut: a replay is allowed, not required. What
	// holds either way is checked by checkAll: every event, each key in order.
	dups := n.checkAll(t, netEvents)
	require.LessOrEqual(t, dups, netEvents, "a replay repeats each record at most once")
}

// netHooks are kgo hooks: buffered when the producer is handed a record, acked when the broker
// answered for it.
type netHooks struct {
	buffered func(*kgo.Record)
	acked    func(*kgo.Record, error)
}

func (h netHooks) OnProduceRecordBuffered(r *kgo.Record) { h.buffered(r) }

func (h netHooks) OnProduceRecordUnbuffered(r *kgo.Record, err error) { h.acked(r, err) }

// brokerWrites is a kgo hook calling f after each write of a produce request to a broker.
type brokerWrites func()

func (f brokerWrites) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err == nil { // Produce
		f()
	}
}

// messageID is the keiro-message-id header of r.
func messageID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == "keiro-message-id" {
			return string(h.Value)
		}
	}
	return ""
}
