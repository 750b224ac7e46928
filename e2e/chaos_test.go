package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/testdb"
	"github.com/keiro-go/keiro/internal/testkafka"
	"github.com/keiro-go/keiro/outbox"
)

// Chaos parameters. KEIRO_CHAOS_DURATION (a Go duration) and KEIRO_CHAOS_EVENTS override the
// CI defaults; `make chaos` sets the duration.
const (
	chaosDefaultDuration = 40 * time.Second
	chaosShortDuration   = 10 * time.Second
	chaosDefaultEvents   = 20000
	chaosShortEvents     = 3000
	chaosRelays          = 3
	chaosConsumers       = 2
	chaosProducers       = 4
	chaosKeys            = 400
	chaosBatch           = 20
	chaosPartitions      = 6
	chaosKillEvery       = time.Second
	chaosOutageEvery     = 7 // kills between two broker outages
	chaosOutage          = 1500 * time.Millisecond
	chaosDrainTimeout    = 4 * time.Minute // at least; 3× the chaos duration for long runs
	// The consumer binary keeps franz-go's 45 s session timeout; a SIGKILLed member would hold
	// its partitions that long. The test broker shortens the sessions its members ask for, as
	// a broker's group.max.session.timeout.ms would not: this keeps CI bounded.
	chaosSessionTimeout   = 6 * time.Second
	chaosRebalanceTimeout = 8 * time.Second
)

func chaosParams(t *testing.T) (time.Duration, int) {
	d, n := chaosDefaultDuration, chaosDefaultEvents
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
// producers enqueue events over many keys and the broker fails for short spells. At the end
// every committed event's effect is applied exactly once and in per-key order, and nothing is
// left in a non-terminal state.
func TestChaos(t *testing.T) {
	duration, total := chaosParams(t)
	ctx := context.Background()
	db := testdb.New(t)
	effectsFixture(t, db)
	kc := testkafka.New(t)
	const topic, group = "e2e.chaos.v1", "chaos"
	kc.CreateTopic(t, topic, chaosPartitions)
	kc.CreateTopic(t, topic+".dlq", 1)

	kc.ControlKey(int16(kmsg.JoinGroup), func(r kmsg.Request) (kmsg.Response, error, bool) {
		if jr, ok := r.(*kmsg.JoinGroupRequest); ok {
			jr.SessionTimeoutMillis = int32(chaosSessionTimeout.Milliseconds())
			jr.RebalanceTimeoutMillis = int32(chaosRebalanceTimeout.Milliseconds())
		}
		return nil, nil, false
	})
	var outage atomic.Bool
	failWhileDown := func(kmsg.Request) (kmsg.Response, error, bool) {
		if outage.Load() {
			kc.KeepControl()
			return nil, errors.New("injected broker outage"), true
		}
		return nil, nil, false
	}
	kc.ControlKey(int16(kmsg.Produce), failWhileDown)
	kc.ControlKey(int16(kmsg.Fetch), failWhileDown)

	relayEnvs := relayEnv(db, kc, "KEIRO_RELAY_LEASE=5s", "KEIRO_RELAY_LOG_LEVEL=warn")
	consumerEnvs := consumerEnv(db, kc, group, topic, "KEIRO_CONSUMER_LOG_LEVEL=info",
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
					k := fmt.Sprintf("key-%03d", rng.IntN(chaosKeys/chaosProducers)*chaosProducers+p)
					seqs[k]++
					evs = append(evs, keyedEvent(topic, k, seqs[k]))
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
	producersDone := make(chan struct{})
	go func() { pwg.Wait(); close(producersDone) }()

	// The driver: kill and restart a random process about every second; every few kills, the
	// broker fails produce and fetch requests for a short spell.
	var (
		kills       = map[string]int{}
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
	for !chaosOver || producersDone != nil || outageEnd != nil {
		select {
		case <-deadline:
			chaosOver = true
		case <-producersDone:
			producersDone = nil
		case <-outageEnd:
			outage.Store(false)
			outageEnd = nil
		case <-kill.C:
			if chaosOver {
				continue
			}
			scrape()
			checkCrashes()
			s := slots[rng.IntN(len(slots))]
			consumerDup += lastDup[s.p]
			s.killed = true
			s.p.kill()
			kills[s.kind]++
			s.p, s.killed = s.start(), false
			if (kills["relay"]+kills["consumer"])%chaosOutageEvery == 0 && outageEnd == nil {
				outages++
				outage.Store(true)
				outageEnd = time.After(chaosOutage)
			}
			// About every second, jittered so that kills land at every stage of a batch.
			kill.Reset(chaosKillEvery/2 + time.Duration(rng.Int64N(int64(chaosKillEvery))))
		}
	}
	chaosTook := time.Since(began)
	pmu.Lock()
	require.NoError(t, perr, "producers")
	pmu.Unlock()
	require.Equal(t, int64(total/chaosBatch*chaosBatch), enqueued.Load())
	checkCrashes()

	// Drain: the surviving processes must publish and apply everything.
	adm := kadm.NewClient(kc.Client(t))
	want64 := int64(0)
	for _, n := range want {
		want64 += n
	}
	drainBegan := time.Now()
	var drained bool
	var lastApplied, lastNotSent int64
	var lastCommitted bool
	drainTimeout := max(chaosDrainTimeout, 3*duration)
	for deadline := time.Now().Add(drainTimeout); time.Now().Before(deadline); {
		checkCrashes()
		var applied, notSent int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.effects`).Scan(&applied))
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_outbox WHERE status <> 'sent'`).Scan(&notSent))
		committed := committedAll(ctx, adm, group, topic)
		lastApplied, lastNotSent, lastCommitted = applied, notSent, committed
		if applied >= want64 && notSent == 0 && committed {
			drained = true
			break
		}
		// Polling another process's progress: the tick only bounds the rate.
		time.Sleep(200 * time.Millisecond)
	}
	drainTook := time.Since(drainBegan)
	scrape()
	var survivorsDup float64
	for _, s := range slots {
		survivorsDup += lastDup[s.p]
	}
	if !drained {
		t.Logf("not drained: %d of %d effects applied, %d outbox rows not sent, all offsets committed: %v",
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
		for _, s := range slots {
			t.Logf("%s log tail:\n%s", s.p.name, tail(s.p.log(), 40))
		}
	}
	require.True(t, drained, "drained within %s", drainTimeout)
	require.Empty(t, crashes, "processes exited without being killed")
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
	report := fmt.Sprintf(`chaos: %d events over %d keys in %s of chaos (+%s drain)
chaos: kills: %d relays, %d consumers; broker outages: %d x %s
chaos: records in Kafka %d = %d events + %d duplicates published (relay at-least-once)
chaos: duplicate deliveries suppressed by the inbox >= %.0f (killed consumers counted at their last scrape)
chaos: effects applied %d (%d distinct); per-key order violations %d; outbox %v; inbox rows not completed %d`,
		want64, len(want), chaosTook.Round(time.Second), drainTook.Round(time.Second),
		kills["relay"], kills["consumer"], outages, chaosOutage,
		o.topicRecords, want64, o.topicRecords-want64,
		consumerDup+survivorsDup,
		o.effects, o.distinct, len(o.orderViolations), o.outboxByStatus, o.inboxNotCompleted)
	fmt.Println(report)

	require.Equal(t, want64, o.effects, "every event applied exactly once")
	require.Equal(t, want64, o.distinct)
	require.Empty(t, o.orderViolations, "per-key order of effects")
	require.Zero(t, o.outboxNotSent, "no outbox row pending, publishing, failed or dead: %v", o.outboxByStatus)
	require.Zero(t, o.inboxNotCompleted, "no inbox row failed")
	require.GreaterOrEqual(t, o.topicRecords, want64)
	require.Positive(t, kills["relay"]+kills["consumer"])
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
