package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
	"github.com/keiro-go/keiro/outbox"
)

// Chaos parameters. KEIRO_CHAOS_DURATION (a Go duration) and KEIRO_CHAOS_EVENTS override the
// CI defaults; `make chaos` sets the duration.
const (
	chaosDefaultDuration = 40 * time.Second
	chaosShortDuration   = 10 * time.Second
	chaosDefaultEvents   = 20000
	chaosShortEvents     = 3000
	// Log mode's run is shorter: its relays are active–standby on one slot, so the run adds
	// failovers rather than throughput, and the suite's time is bounded.
	chaosLogDuration    = 20 * time.Second
	chaosLogEvents      = 10000
	chaosRelays         = 3
	chaosConsumers      = 2
	chaosProducers      = 4
	chaosKeys           = 400
	chaosPlainProducers = 2  // plain-SQL writers, sharing their keys
	chaosPlainKeys      = 20 // keys of the plain-SQL writers
	chaosBatch          = 20
	chaosPartitions     = 6
	chaosKillEvery      = time.Second
	chaosOutageEvery    = 7 // kills between two broker outages
	chaosOutage         = 1500 * time.Millisecond
	chaosStopEvery      = 4               // relay kills between two relays stopped (SIGSTOP) past their lease
	chaosSpanEvery      = 20              // one key in this many alternates between the two topics
	chaosDrainTimeout   = 4 * time.Minute // at least; 3× the chaos duration for long runs
	// The consumer binary keeps franz-go's 45 s session timeout by default; a SIGKILLed member
	// would hold its partitions that long. The chaos consumers ask for shorter sessions (6 s is
	// a real broker's group.min.session.timeout.ms): this keeps CI bounded.
	chaosSessionTimeout   = 6 * time.Second
	chaosRebalanceTimeout = 8 * time.Second
)

func chaosParams(t *testing.T, mode string) (time.Duration, int) {
	d, n := chaosDefaultDuration, chaosDefaultEvents
	if mode == "log" {
		d, n = chaosLogDuration, chaosLogEvents
	}
	if testing.Short() {
		d, n = chaosShortDuration, chaosShortEvents
	}
	if s := os.Getenv("KEIRO_CHAOS_DURATION"); s != "" {
		v, err := time.ParseDuration(s)
		require.NoError(t, err, "KEIRO_CHAOS_DURATION")
		d = v
		// Keep the producers busy for the whole run at about the CI rate.
		n = max(n, int(d.Seconds()*chaosDefaultEvents/chaosDefaultDuration.Seconds()))
	}
	if s := os.Getenv("KEIRO_CHAOS_EVENTS"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(t, err, "KEIRO_CHAOS_EVENTS")
		n = v
	}
	return d, n
}

// slot is one relay or consumer position: the process filling it is killed and replaced.
type slot struct {
	kind   string // "relay" or "consumer"
	i      int
	start  func() *proc
	p      *proc
	killed bool // p was killed by the driver
}

// TestChaos: 3 relays and 2 consumers are SIGKILLed and restarted about every second while
// producers enqueue events over many keys and the broker fails for short spells; now and then a
// relay is stopped (SIGSTOP) past its lease instead, then continued. Some keys span two topics
// led by two brokers, one of which fails a produce request in five. At the end every committed
// event's effect is applied exactly once and in per-key order (for a key spanning topics, its
// records reached Kafka in order), and nothing is left in a non-terminal state.
//
// The "log" subtest runs the same scenario on a real broker with the relays in log mode
// (active–standby on the schema's replication slot): a stopped relay holds the slot while it
// is stopped, and every row of keiro_outbox_log must reach the consumer's effects.
func TestChaos(t *testing.T) {
	t.Run("kfake", func(t *testing.T) { testChaos(t, kfakeChaosBroker(t), "claim") })
	t.Run("kafka", func(t *testing.T) { testChaos(t, realChaosBroker(t), "claim") })
	t.Run("log", func(t *testing.T) {
		cb := realChaosBroker(t)
		cb.deep = false // the deep-backlog phase stops the claim relays past their lease
		testChaos(t, cb, "log")
	})
	// The same runs with --exactly-once: a read_committed reader sees each event once.
	t.Run("kafka-eos", func(t *testing.T) {
		cb := realChaosBroker(t)
		cb.deep, cb.eos = false, true
		testChaos(t, cb, "claim")
	})
	t.Run("log-eos", func(t *testing.T) {
		cb := realChaosBroker(t)
		cb.deep, cb.eos = false, true
		testChaos(t, cb, "log")
	})
}

// chaosBroker is the Kafka of a chaos run and its way of failing.
type chaosBroker struct {
	kc               *testenv.Kafka
	topic, spanTopic string
	// outage starts (true) or ends (false) a broker outage.
	outage func(bool)
	// what describes the failures, for the report.
	what string
	// deep: the run ends with the deep-backlog phase (deepBacklogPhase).
	deep bool
	// eos: the relays publish with --exactly-once (random instance ids in claim mode), and
	// the topics' committed records hold each event once.
	eos bool
}

// kfakeChaosBroker is two embedded brokers that refuse every produce and fetch during an
// outage; the span topic is led by the second broker, which also fails one produce request
// in five.
func kfakeChaosBroker(t *testing.T) chaosBroker {
	kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{ClusterOpts: []kfake.Opt{kfake.NumBrokers(2)}})
	topic, spanTopic := kc.Topic("e2e.chaos.v1"), kc.Topic("e2e.chaos.span.v1")
	kc.CreateTopic(t, topic, chaosPartitions)
	kc.CreateTopic(t, spanTopic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	for p := range int32(chaosPartitions) {
		require.NoError(t, kc.Cluster.MoveTopicPartition(topic, p, 0))
	}
	require.NoError(t, kc.Cluster.MoveTopicPartition(spanTopic, 0, 1))
	spanID := kc.Cluster.TopicInfo(spanTopic).TopicID

	var outage atomic.Bool
	failWhileDown := func(kmsg.Request) (kmsg.Response, error, bool) {
		if outage.Load() {
			kc.Cluster.KeepControl()
			return nil, errors.New("injected broker outage"), true
		}
		return nil, nil, false
	}
	var spanReqs atomic.Int64
	kc.Cluster.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		if resp, err, ok := failWhileDown(r); ok {
			return resp, err, ok
		}
		req := r.(*kmsg.ProduceRequest)
		for _, tp := range req.Topics {
			if (tp.Topic == spanTopic || tp.TopicID == spanID) && spanReqs.Add(1)%5 == 0 {
				return testenv.ProduceError(req, kerr.UnknownServerError.Code), nil, true
			}
		}
		return nil, nil, false
	})
	kc.Cluster.ControlKey(int16(kmsg.Fetch), failWhileDown)
	return chaosBroker{kc: kc, topic: topic, spanTopic: spanTopic, outage: outage.Store,
		what: "embedded brokers refusing produce and fetch"}
}

// realChaosBroker is a real Apache Kafka broker of the test's own, SIGSTOPped for an outage
// (it keeps its connections and answers nothing, as a broker in a long pause does).
func realChaosBroker(t *testing.T) chaosBroker {
	c, err := kafkabroker.Start(context.Background(), kafkabroker.Config{
		Props: map[string]string{"auto.create.topics.enable": "false"},
	})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true, Brokers: c.Seeds()})
	topic, spanTopic := kc.Topic("e2e.chaos.v1"), kc.Topic("e2e.chaos.span.v1")
	kc.CreateTopic(t, topic, chaosPartitions)
	kc.CreateTopic(t, spanTopic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	b := c.Brokers[0]
	return chaosBroker{kc: kc, topic: topic, spanTopic: spanTopic, what: "a real broker SIGSTOPped", deep: true,
		outage: func(down bool) {
			if down {
				require.NoError(t, b.Pause())
			} else {
				require.NoError(t, b.Resume())
			}
		}}
}

func testChaos(t *testing.T, cb chaosBroker, mode string) {
	duration, total := chaosParams(t, mode)
	ctx := context.Background()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	kc, topic, spanTopic, group := cb.kc, cb.topic, cb.spanTopic, cb.kc.Group("chaos")

	// Attempts are plenty: the injected failures of the span topic must not kill rows. In log
	// mode the lease and the attempts apply to the rows written to keiro_outbox before a relay
	// switched the schema (the log-mode relay drains them first).
	relayEnvs := relayEnv(db, kc, "KEIRO_RELAY_LEASE=5s", "KEIRO_RELAY_LOG_LEVEL=warn", "KEIRO_RELAY_MAX_ATTEMPTS=100")
	if cb.eos {
		relayEnvs = append(relayEnvs, "KEIRO_RELAY_EXACTLY_ONCE=true",
			"KEIRO_RELAY_OFFSETS_TOPIC="+kc.Topic("keiro-relay-offsets"),
			"KEIRO_RELAY_TRANSACTION_TIMEOUT="+eosTxnTimeout.String())
	}
	if mode == "log" {
		// The schema's own slot (its name holds the test schema's), dropped once the relays
		// are gone. Slots that earlier runs killed by their timeout left (inactive, over
		// 1 GiB of WAL kept) are dropped first, as the outbox's log-mode tests do.
		_, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
            WHERE NOT active AND slot_name ~ '^t_[0-9a-f]{12}_keiro_log$'
              AND pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) > 1073741824`)
		if err != nil {
			t.Logf("sweep abandoned test slots: %v", err)
		}
		slotName := outbox.DefaultLogSlot(db.Schema)
		relayEnvs = append(relayEnvs, "KEIRO_RELAY_MODE=log", "KEIRO_RELAY_LOG_SLOT="+slotName)
		t.Cleanup(func() { dropSlot(t, db, slotName) }) // runs after the processes' kills
		// The relays switch the schema themselves, three at once (each starts with
		// --mode=log on a claim-mode schema) while the producers start writing: the rows
		// written to keiro_outbox before the switch are drained first.
	}
	consumerEnvs := consumerEnv(db, kc, group, topic+","+spanTopic, "KEIRO_CONSUMER_LOG_LEVEL=info",
		"KEIRO_CONSUMER_SESSION_TIMEOUT="+chaosSessionTimeout.String(),
		"KEIRO_CONSUMER_REBALANCE_TIMEOUT="+chaosRebalanceTimeout.String())
	var slots []*slot
	for i := range chaosRelays {
		s := &slot{kind: "relay", i: i}
		s.start = func() *proc { return startProc(t, fmt.Sprintf("relay-%d", i), relayBin, relayAddrRe, relayEnvs) }
		slots = append(slots, s)
	}
	for i := range chaosConsumers {
		s := &slot{kind: "consumer", i: i}
		// Consumer 0 runs the one-message path, the others the defaults (group commit: a failure
		// inside a batch is retried in place), so both are killed mid-transaction.
		envs := consumerEnvs
		if i == 0 {
			envs = append(consumerEnvs[:len(consumerEnvs):len(consumerEnvs)], "KEIRO_CONSUMER_BATCH_SIZE=1")
		}
		s.start = func() *proc {
			return startProc(t, fmt.Sprintf("consumer-%d", i), consumerBin, consumerAddrRe, envs)
		}
		slots = append(slots, s)
	}
	for _, s := range slots {
		s.p = s.start()
	}

	// Producers: each owns the keys ≡ p (mod chaosProducers) and numbers each key's events
	// 1, 2, 3, … in commit order (one writer per key, one transaction at a time).
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	began := time.Now()
	var (
		enqueued atomic.Int64
		pwg      sync.WaitGroup
		pmu      sync.Mutex
		want     = map[string]int64{}
		perr     error
	)
	batches := total / chaosBatch
	pace := time.Duration(float64(duration) * 0.8 / float64(max(1, batches/chaosProducers)))
	for p := range chaosProducers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			seqs := map[string]int64{}
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for b := p; b < batches; b += chaosProducers {
				evs := make([]envelope.Event, 0, chaosBatch)
				for range chaosBatch {
					ki := rng.IntN(chaosKeys/chaosProducers)*chaosProducers + p
					k := fmt.Sprintf("key-%03d", ki)
					seqs[k]++
					to := topic
					if ki%chaosSpanEvery == 0 && seqs[k]%2 == 0 {
						to = spanTopic
					}
					evs = append(evs, keyedEvent(to, k, seqs[k]))
				}
				if err := enqueue(ctx, db.Pool, ob, evs...); err != nil {
					pmu.Lock()
					perr = errors.Join(perr, err)
					pmu.Unlock()
					return
				}
				enqueued.Add(int64(len(evs)))
				<-tick.C
			}
			pmu.Lock()
			for k, n := range seqs {
				want[k] = n
			}
			pmu.Unlock()
		}()
	}
	// Plain-SQL producers, as a service without keiro's library writes: each row a plain INSERT
	// in its own transaction, the writers sharing their keys. The INSERT holds the row's key
	// (the outbox's insert trigger) until commit, so the number the row gets after it is its
	// position in the key's commit order; a quarter of the transactions commit late.
	var plainMu sync.Mutex
	plainSeqs := map[string]int64{}
	plainRows := total / 10 / chaosPlainProducers
	plainPace := time.Duration(float64(duration) * 0.8 / float64(max(1, plainRows)))
	for p := range chaosPlainProducers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 11))
			tick := time.NewTicker(plainPace)
			defer tick.Stop()
			for i := range plainRows {
				k := fmt.Sprintf("plain-%02d", rng.IntN(chaosPlainKeys))
				next := func() int64 { plainMu.Lock(); defer plainMu.Unlock(); plainSeqs[k]++; return plainSeqs[k] }
				enq := plainEnqueue
				if mode == "log" {
					enq = plainEnqueueLocked
				}
				if err := enq(ctx, db, topic, k, fmt.Sprintf("plain-%d-%06d", p, i), rng.IntN(4) == 0, next); err != nil {
					pmu.Lock()
					perr = errors.Join(perr, err)
					pmu.Unlock()
					return
				}
				<-tick.C
			}
		}()
	}
	producersDone := make(chan struct{})
	go func() { pwg.Wait(); close(producersDone) }()

	// The driver: kill and restart a random process about every second; every few kills, the
	// broker fails produce and fetch requests for a short spell.
	var (
		kills       = map[string]int{}
		stops       int
		stopped     *proc
		contAt      <-chan time.Time
		outages     int
		crashes     []string
		consumerDup float64 // duplicates counted by consumers that were killed (last scrape)
		lastDup     = map[*proc]float64{}
	)
	scrape := func() {
		for _, s := range slots {
			if s.kind != "consumer" {
				continue
			}
			select {
			case a := <-s.p.addr:
				s.p.addr <- a
				if v, err := metric(a, "keiro_inbox_duplicates_total"); err == nil {
					lastDup[s.p] = v
				}
			default:
			}
		}
	}
	checkCrashes := func() {
		for _, s := range slots {
			select {
			case <-s.p.done:
				if !s.killed {
					crash := fmt.Sprintf("%s exited by itself (code %d) at %s:\n%s", s.p.name, s.p.exitCode(),
						time.Since(began).Round(time.Millisecond), tail(s.p.log(), 30))
					t.Log(crash)
					crashes = append(crashes, crash)
				}
				s.p, s.killed = s.start(), false
			default:
			}
		}
	}
	rng := rand.New(rand.NewPCG(42, uint64(began.UnixNano())))
	var outageEnd <-chan time.Time
	kill := time.NewTimer(chaosKillEvery)
	defer kill.Stop()
	deadline := time.After(duration)
	chaosOver := false
	for !chaosOver || producersDone != nil || outageEnd != nil || contAt != nil {
		select {
		case <-deadline:
			chaosOver = true
		case <-contAt:
			_ = stopped.cmd.Process.Signal(syscall.SIGCONT) // (it may have been killed since)
			stopped, contAt = nil, nil
		case <-producersDone:
			producersDone = nil
		case <-outageEnd:
			cb.outage(false)
			outageEnd = nil
		case <-kill.C:
			if chaosOver {
				continue
			}
			scrape()
			checkCrashes()
			s := slots[rng.IntN(len(slots))]
			if s.kind == "relay" && contAt == nil && (kills["relay"]+1)%chaosStopEvery == 0 {
				// Stopped past its lease (5 s) while the others take its rows over. In log mode
				// a stopped active relay keeps the slot (its walsender waits up to
				// wal_sender_timeout, 60 s by default): the standbys wait, and the stream
				// goes on when the relay is continued 7 s later.
				require.NoError(t, s.p.cmd.Process.Signal(syscall.SIGSTOP))
				stops++
				kills["relay"]++
				stopped, contAt = s.p, time.After(7*time.Second)
				kill.Reset(chaosKillEvery)
				continue
			}
			consumerDup += lastDup[s.p]
			s.killed = true
			s.p.kill()
			kills[s.kind]++
			s.p, s.killed = s.start(), false
			if (kills["relay"]+kills["consumer"])%chaosOutageEvery == 0 && outageEnd == nil {
				outages++
				cb.outage(true)
				outageEnd = time.After(chaosOutage)
			}
			// About every second, jittered so that kills land at every stage of a batch.
			kill.Reset(chaosKillEvery/2 + time.Duration(rng.Int64N(int64(chaosKillEvery))))
		}
	}
	chaosTook := time.Since(began)
	pmu.Lock()
	require.NoError(t, perr, "producers")
	for k, n := range plainSeqs {
		want[k] = n
	}
	pmu.Unlock()
	require.Equal(t, int64(total/chaosBatch*chaosBatch), enqueued.Load())
	checkCrashes()

	// Drain: the surviving processes must publish and apply everything.
	adm := kadm.NewClient(kc.Client)
	want64 := int64(0)
	for _, n := range want {
		want64 += n
	}
	drainBegan := time.Now()
	drainTimeout := max(chaosDrainTimeout, 3*duration)
	// Under exactly-once the topics end with commit markers, past which a consumer commits no
	// offset: the group is done once it committed past the last committed record.
	var committedReader *committedReader
	if cb.eos {
		committedReader = startCommittedReader(t, kc.Seeds, topic, spanTopic)
	}
	groupDone := func() bool {
		if committedReader == nil {
			return committedAll(ctx, adm, group, topic)
		}
		return committedReader.caughtUp(ctx, adm) && committedReader.committedPast(ctx, adm, group, topic)
	}
	waitDrained := func() {
		var drained bool
		var lastApplied, lastNotSent int64
		var lastCommitted bool
		for deadline := time.Now().Add(drainTimeout); time.Now().Before(deadline); {
			checkCrashes()
			var applied, notSent int64
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.effects`).Scan(&applied))
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_outbox WHERE status <> 'sent'`).Scan(&notSent))
			if mode == "log" {
				notSent += logRowsNotApplied(t, db)
			}
			committed := groupDone()
			lastApplied, lastNotSent, lastCommitted = applied, notSent, committed
			if applied >= want64 && notSent == 0 && committed {
				drained = true
				break
			}
			// Polling another process's progress: the tick only bounds the rate.
			time.Sleep(200 * time.Millisecond)
		}
		if drained {
			return
		}
		t.Logf("not drained: %d of %d effects applied, %d outbox rows not sent (log mode: or log rows not applied), all offsets committed: %v",
			lastApplied, want64, lastNotSent, lastCommitted)
		rows, err := db.Pool.Query(ctx, `SELECT status, count(*), min(attempt_count), max(attempt_count), max(last_error) FROM `+db.Schema+`.keiro_outbox GROUP BY status`)
		if err == nil {
			for rows.Next() {
				var st string
				var n, mina, maxa int64
				var le *string
				if rows.Scan(&st, &n, &mina, &maxa, &le) == nil {
					t.Logf("outbox %s: %d rows, attempts %d..%d, last error %v", st, n, mina, maxa, deref(le))
				}
			}
			rows.Close()
		}
		if !lastCommitted {
			for _, tp := range []string{topic, spanTopic} {
				gaps, err := commitGaps(ctx, adm, group, tp)
				// Under exactly-once a partition may end with a marker the group cannot commit past.
				t.Logf("%s: partitions not committed to their end (committed/end): %v %v", tp, gaps, err)
			}
		}
		for _, s := range slots {
			t.Logf("%s log tail:\n%s", s.p.name, tail(s.p.log(), 40))
		}
		require.Fail(t, "not drained", "drained within %s", drainTimeout)
	}
	waitDrained()
	drainTook := time.Since(drainBegan)
	require.Empty(t, crashes, "processes exited without being killed")
	if cb.deep && deepPhaseEnabled(t) {
		relays := func() []int {
			var pids []int
			for _, s := range slots {
				if s.kind == "relay" {
					pids = append(pids, s.p.cmd.Process.Pid)
				}
			}
			return pids
		}
		for k, n := range deepBacklogPhase(t, db, cb, relays) {
			want[k] = n
			want64 += n
		}
		waitDrained()
		require.Empty(t, crashes, "processes exited without being killed")
	}
	scrape()
	var survivorsDup float64
	for _, s := range slots {
		survivorsDup += lastDup[s.p]
	}
	// SIGTERM everything at once; every process must exit 0. An exit slower than 10 s is logged
	// (TestConsumerShutdownDuringRebalance bounds the consumer's exit during a rebalance).
	var twg sync.WaitGroup
	codes := make([]int, len(slots))
	errs := make([]error, len(slots))
	took := make([]time.Duration, len(slots))
	for i, s := range slots {
		twg.Add(1)
		go func() {
			defer twg.Done()
			t0 := time.Now()
			codes[i], errs[i] = s.p.stop(90 * time.Second)
			took[i] = time.Since(t0)
		}()
	}
	twg.Wait()
	for i, s := range slots {
		require.NoError(t, errs[i])
		require.Equal(t, 0, codes[i], "%s exit code after SIGTERM:\n%s", s.p.name, tail(s.p.log(), 30))
		if took[i] > 10*time.Second {
			t.Logf("SLOW EXIT: %s took %s to exit after SIGTERM (--shutdown-timeout=5s)", s.p.name, took[i].Round(time.Millisecond))
		}
	}

	o := readOutcome(t, db, kc, topic, want)
	// A spanning key's effects come from two topics the consumer reads independently, so
	// their order is checked where the relay promises it: on Kafka, each event's first copy
	// was produced no earlier than the key's event before it.
	o.orderViolations = slices.DeleteFunc(o.orderViolations, func(v string) bool {
		var ki int
		_, err := fmt.Sscanf(v, "key-%03d: applied seq", &ki)
		return err == nil && ki%chaosSpanEvery == 0
	})
	spanEnds, err := adm.ListEndOffsets(ctx, spanTopic)
	require.NoError(t, err)
	spanEnds.Each(func(l kadm.ListedOffset) { o.topicRecords += l.Offset })
	// The records on Kafka: every record up to the end offsets; under exactly-once the
	// committed ones, as a read_committed reader sees them (the commit and abort markers and
	// the aborted records occupy offsets too).
	var recs []*kgo.Record
	copies := map[string]int{}
	if cb.eos {
		committedReader.waitCaughtUp(t, adm, time.Minute)
		recs = committedReader.snapshot()
		for _, r := range recs {
			copies[string(r.Key)+"/"+messageID(r)]++
		}
	} else {
		recs = consumeAll(t, kc, int(o.topicRecords), time.Minute, topic, spanTopic)
		require.Len(t, recs, int(o.topicRecords))
	}
	var twice int
	for _, n := range copies {
		if n > 1 {
			twice++
		}
	}
	spanViolations := spanOrder(recs, chaosSpanEvery)
	var plainTotal int64
	for _, n := range plainSeqs {
		plainTotal += n
	}
	var logRows, logNotApplied int64
	if mode == "log" {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_outbox_log`).Scan(&logRows))
		logNotApplied = logRowsNotApplied(t, db)
	}
	published := "relay at-least-once"
	if cb.eos {
		published = fmt.Sprintf("exactly once, read_committed; %d offsets in Kafka, markers and aborted records included", o.topicRecords)
	}
	report := fmt.Sprintf(`chaos: %s mode: %d events (%d by plain SQL) over %d keys in %s of chaos (+%s drain); keiro_outbox_log rows %d
chaos: kills: %d relays (%d of them stops past the lease), %d consumers; broker outages (%s): %d x %s
chaos: records in Kafka %d = %d events + %d duplicates published (%s)
chaos: duplicate deliveries suppressed by the inbox >= %.0f (killed consumers counted at their last scrape)
chaos: effects applied %d (%d distinct); per-key order violations %d; outbox %v; inbox rows not completed %d`,
		mode, want64, plainTotal, len(want), chaosTook.Round(time.Second), drainTook.Round(time.Second), logRows,
		kills["relay"], stops, kills["consumer"], cb.what, outages, chaosOutage,
		int64(len(recs)), want64, int64(len(recs))-want64, published,
		consumerDup+survivorsDup,
		o.effects, o.distinct, len(o.orderViolations), o.outboxByStatus, o.inboxNotCompleted)
	fmt.Println(report)

	require.Equal(t, want64, o.effects, "every event applied exactly once")
	require.Equal(t, want64, o.distinct)
	require.Empty(t, o.orderViolations, "per-key order of effects")
	require.Empty(t, spanViolations, "per-key order on Kafka of the keys spanning two topics")
	require.Zero(t, o.outboxNotSent, "no outbox row pending, publishing, failed or dead: %v", o.outboxByStatus)
	require.Zero(t, o.inboxNotCompleted, "no inbox row failed")
	if mode == "log" {
		// keiro_outbox_log has no status: each of its rows is terminal once its message's
		// effect is applied, and every event is one of its rows (the schema was in log mode
		// before the first enqueue; rows of keiro_outbox would be claimed first).
		require.Zero(t, logNotApplied, "every keiro_outbox_log row's message applied by the consumer")
		// An event may be in both tables: a relay that read claim mode, created the slot and
		// then found the schema switched by another relay copies the events written since
		// the switch into keiro_outbox, in case its slot missed them (Relay.recoverSwitchGap;
		// duplicates the inbox drops). Every event is in one of them.
		var events, both int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE n = 2) FROM (
			SELECT source, message_id, count(*) AS n FROM (
				SELECT source, message_id FROM `+db.Schema+`.keiro_outbox_log
				UNION ALL SELECT source, message_id FROM `+db.Schema+`.keiro_outbox) r
			GROUP BY 1, 2) e`).Scan(&events, &both))
		fmt.Printf("chaos: events in both tables (a relay's copy of the switch's gap): %d\n", both)
		require.Equal(t, want64, events, "every event is a row of keiro_outbox_log or keiro_outbox")
		require.Positive(t, logRows, "the relays switched the schema to log mode")
	}
	require.GreaterOrEqual(t, o.topicRecords, want64)
	if cb.eos {
		require.Zero(t, twice, "no event committed twice on Kafka")
		require.Equal(t, want64, int64(len(recs)), "each event committed once on Kafka (read_committed)")
		require.Len(t, copies, int(want64))
		// Each key of one topic in order on Kafka (the spanning keys are checked above).
		oneTopic := slices.DeleteFunc(slices.Clone(recs), func(r *kgo.Record) bool {
			var ki int
			_, err := fmt.Sscanf(string(r.Key), "key-%03d", &ki)
			return err == nil && ki%chaosSpanEvery == 0
		})
		require.Empty(t, keyInversions(oneTopic), "per-key order of the committed records")
	}
	require.Positive(t, kills["relay"]+kills["consumer"])
}

// spanOrder checks the keys spanning two topics (key number ≡ 0 mod every): by event seq, the
// first copies' produce timestamps never decrease (a later event produced before an earlier
// one reached Kafka means the earlier one failed while the later one got through).
func spanOrder(recs []*kgo.Record, every int) []string {
	first := map[string]map[int64]time.Time{}
	for _, r := range recs {
		var ki int
		var seq int64
		if _, err := fmt.Sscanf(string(r.Key), "key-%03d", &ki); err != nil || ki%every != 0 {
			continue
		}
		if _, err := fmt.Sscanf(string(r.Value), `{"seq":%d}`, &seq); err != nil {
			continue
		}
		k := string(r.Key)
		if first[k] == nil {
			first[k] = map[int64]time.Time{}
		}
		if ts, ok := first[k][seq]; !ok || r.Timestamp.Before(ts) {
			first[k][seq] = r.Timestamp
		}
	}
	var out []string
	for k, m := range first {
		for seq := int64(2); ; seq++ {
			ts, ok := m[seq]
			if !ok {
				break
			}
			if prev := m[seq-1]; ts.Before(prev) {
				out = append(out, fmt.Sprintf("%s: event %d produced before event %d", k, seq, seq-1))
			}
		}
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// plainEnqueue writes event id of key with plain SQL in a transaction of its own. The row is
// numbered (next) once its INSERT holds the key, so numbers follow the key's commit order; late
// holds the transaction open a little longer.
func plainEnqueue(ctx context.Context, db *testenv.DB, topic, key, id string, late bool, next func() int64) error {
	return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var outboxID [16]byte
		if err := tx.QueryRow(ctx, `INSERT INTO `+db.Schema+`.keiro_outbox (outbox_id, message_id, source,
            destination, message_key, event_type, schema_version, content_type, payload_bytes, occurred_at)
            VALUES (gen_random_uuid(), $1, 'e2e-sql', $2, $3, 'Counted', 1, 'application/json', '', now())
            RETURNING outbox_id`, id, topic, key).Scan(&outboxID); err != nil {
			return fmt.Errorf("plain insert %s: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+db.Schema+`.keiro_outbox SET payload_bytes = convert_to(format('{"seq":%s}', $2::bigint), 'UTF8')
            WHERE outbox_id = $1`, outboxID, next()); err != nil {
			return fmt.Errorf("plain insert %s: number it: %w", id, err)
		}
		if late {
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.02)`); err != nil {
				return fmt.Errorf("plain insert %s: %w", id, err)
			}
		}
		return nil
	})
}

// plainEnqueueLocked is plainEnqueue for log mode, where the outbox's insert trigger routes a
// plain INSERT into keiro_outbox_log (no RETURNING row, no later UPDATE: the slot publishes
// inserts only) and takes no key lock: the transaction holds an advisory lock on the key
// before numbering the row, so numbers follow the key's commit order.
func plainEnqueueLocked(ctx context.Context, db *testenv.DB, topic, key, id string, late bool, next func() int64) error {
	return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, key); err != nil {
			return fmt.Errorf("plain insert %s: lock key: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+db.Schema+`.keiro_outbox (outbox_id, message_id, source,
            destination, message_key, event_type, schema_version, content_type, payload_bytes, occurred_at)
            VALUES (gen_random_uuid(), $1, 'e2e-sql', $2, $3, 'Counted', 1, 'application/json',
            convert_to(format('{"seq":%s}', $4::bigint), 'UTF8'), now())`, id, topic, key, next()); err != nil {
			return fmt.Errorf("plain insert %s: %w", id, err)
		}
		if late {
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.02)`); err != nil {
				return fmt.Errorf("plain insert %s: %w", id, err)
			}
		}
		return nil
	})
}

// logRowsNotApplied counts the rows of keiro_outbox_log whose message has no effect.
func logRowsNotApplied(t *testing.T, db *testenv.DB) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+db.Schema+`.keiro_outbox_log l
        WHERE NOT EXISTS (SELECT 1 FROM `+db.Schema+`.effects e WHERE e.message_id = l.message_id)`).Scan(&n))
	return n
}

// dropSlot drops the replication slot and publication of log mode once the relays holding it
// have exited (their walsenders release the slot shortly after).
func dropSlot(t *testing.T, db *testenv.DB, slot string) {
	ctx := context.Background()
	var err error
	for range 200 {
		_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling another process's exit
	}
	if err != nil {
		t.Errorf("drop replication slot %s: %v", slot, err)
	}
	_, _ = db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{slot}.Sanitize())
}
