package e2e

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// The chaos test's deep-backlog phase: the broker is out for a long spell while producers keep
// writing, and the relays must then drain the backlog the outage left as efficiently as they
// drain a shallow one. KEIRO_CHAOS_DEEP_OUTAGE overrides the long outage.
const (
	deepOutage        = 60 * time.Second
	deepShortOutage   = 15 * time.Second
	deepShallowOutage = 7 * time.Second
	deepKeys          = 200
	deepBatch         = 20
	deepRate          = 1000 // rows per second offered during the phase
	deepPayload       = 1024 // bytes of padding per row
	// deepShallowRuns is how many short outages measure the shallow drain (their median is
	// the reference): one short drain is a few seconds, too few for a stable figure.
	deepShallowRuns = 3
	// deepMaxCostRatio bounds the database CPU the relays' sessions spend per row drained
	// after the long outage against the shallow drains' median. The goal is 1.25 (a drain rate
	// of 0.8× where the database bounds it; docs/benchmarks-history.md records the runs); the
	// test allows 2.5× because one such measurement varies by ±50 % on a shared 2-core machine
	// (0.6–1.95× measured between identical runs), while a claim whose cost follows the
	// backlog's depth costs 5–10× per row on a backlog this deep (the cliff this phase guards
	// against: 0.8–1.5k msgs/s against 8.9k for a shallow one).
	deepMaxCostRatio = 2.5
)

// deepPhaseEnabled reports whether the deep-backlog phase runs: with KEIRO_CHAOS_DEEP set (make
// chaos sets it). It adds two and a half minutes of outages and drains to the chaos test, so the
// default run leaves it out. (It found a stall after a SIGSTOP of the broker, fixed since: a
// partition whose leader moved as the broker resumed waited franz-go's five-second metadata
// interval, and every batch behind it waited too; see outbox.DefaultMetadataMinAge.)
func deepPhaseEnabled(t *testing.T) bool {
	if os.Getenv("KEIRO_CHAOS_DEEP") == "" {
		t.Log("deep-backlog phase left out: set KEIRO_CHAOS_DEEP=1 (make chaos does)")
		return false
	}
	return true
}

func deepOutageLength(t *testing.T) time.Duration {
	d := deepOutage
	if testing.Short() {
		d = deepShortOutage
	}
	if s := os.Getenv("KEIRO_CHAOS_DEEP_OUTAGE"); s != "" {
		v, err := time.ParseDuration(s)
		require.NoError(t, err, "KEIRO_CHAOS_DEEP_OUTAGE")
		d = v
	}
	return d
}

// drainCost is what the relays spent draining one outage's backlog.
type drainCost struct {
	backlog int64         // rows not sent when the broker came back
	took    time.Duration // until every row written before it came back was sent
	sent    int64         // rows sent meanwhile (the backlog and the rows written since)
	// CPU of the relay processes and of their PostgreSQL backends meanwhile.
	relayCPU, dbCPU time.Duration
}

func (c drainCost) dbPerRow() time.Duration    { return c.dbCPU / time.Duration(max(c.sent, 1)) }
func (c drainCost) relayPerRow() time.Duration { return c.relayCPU / time.Duration(max(c.sent, 1)) }

func (c drainCost) String() string {
	return fmt.Sprintf("backlog %d rows drained in %s (%.0f rows/s, %d sent meanwhile), CPU per row: database %s, relays %s",
		c.backlog, c.took.Round(10*time.Millisecond), float64(c.backlog)/c.took.Seconds(), c.sent, c.dbPerRow(), c.relayPerRow())
}

// deepBacklogPhase writes deepRate rows per second over keys of its own while the broker is out
// first for deepShallowOutage, then for the long outage, and measures each drain. The drains
// are compared by the CPU the relays' database sessions spend per row, not by rows per second
// of wall-clock time: the other packages' tests share the machine's cores and make a rate
// meaningless, while a claim whose cost grows with the backlog (a plan that walks it) shows
// first as database CPU per row. Rates and the relays' own CPU are reported alongside. It
// returns the keys it wrote and their event counts, for the end-of-test checks.
func deepBacklogPhase(t *testing.T, db *testenv.DB, cb chaosBroker, relays func() []int) map[string]int64 {
	ctx := context.Background()
	long := deepOutageLength(t)
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)

	stop := make(chan struct{})
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		seqs  = map[string]int64{}
		perr  error
		wrote atomic.Int64
	)
	pad := strings.Repeat("x", deepPayload)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second * deepBatch / deepRate)
		defer tick.Stop()
		for b := 0; ; b++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			evs := make([]envelope.Event, 0, deepBatch)
			mu.Lock()
			for i := range deepBatch {
				k := fmt.Sprintf("deep-%03d", (b*deepBatch+i)%deepKeys)
				seqs[k]++
				ev := keyedEvent(cb.topic, k, seqs[k])
				ev.Payload = []byte(fmt.Sprintf(`{"seq":%d,"pad":"%s"}`, seqs[k], pad))
				evs = append(evs, ev)
			}
			mu.Unlock()
			if err := enqueue(ctx, db.Pool, ob, evs...); err != nil {
				mu.Lock()
				perr = errors.Join(perr, err)
				mu.Unlock()
				return
			}
			wrote.Add(deepBatch)
		}
	}()

	// open counts the rows not yet sent (through the claim index: the test must not scan the
	// backlog it measures); the rows sent since a moment are those open then or written since,
	// less those open now.
	open := func() int64 {
		var n int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_outbox WHERE phase = 0`).Scan(&n))
		return n
	}
	outage := func(d time.Duration) drainCost {
		cb.outage(true)
		time.Sleep(d) // the outage's length is the test's input, not a wait for an event
		var last int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM `+db.Schema+`.keiro_outbox`).Scan(&last))
		cb.outage(false)
		open0, wrote0 := open(), wrote.Load()
		sent := func() int64 { return open0 + wrote.Load() - wrote0 - open() }
		// The drain is measured from its first row on (the broker answers what it was sent
		// before it stopped first).
		for resumed := time.Now(); sent() <= 0; {
			require.Less(t, time.Since(resumed), chaosDrainTimeout, "a row sent after the broker came back")
			time.Sleep(10 * time.Millisecond) // polling another process's progress
		}
		m := startCPUMeter(t, db, relays)
		began, sent0 := time.Now(), sent()
		c := drainCost{backlog: open()}
		var timeline []string
		prev, tick := sent0, began
		for deadline := began.Add(chaosDrainTimeout); ; {
			var left bool
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+db.Schema+`.keiro_outbox
                WHERE phase = 0 AND seq <= $1)`, last).Scan(&left))
			if !left {
				break
			}
			if time.Since(tick) >= time.Second {
				n := sent()
				timeline = append(timeline, strconv.FormatInt(n-prev, 10))
				prev, tick = n, time.Now()
			}
			require.True(t, time.Now().Before(deadline), "the backlog of a %s outage drained within %s", d, chaosDrainTimeout)
			time.Sleep(50 * time.Millisecond) // polling another process's progress
		}
		c.took, c.sent = time.Since(began), sent()-sent0
		c.relayCPU, c.dbCPU = m.stop()
		fmt.Printf("chaos: deep backlog: rows sent per second after a %s outage: %s\n", d, strings.Join(timeline, " "))
		return c
	}
	var shallows []drainCost
	for range deepShallowRuns {
		shallows = append(shallows, outage(deepShallowOutage))
	}
	slices.SortFunc(shallows, func(a, b drainCost) int { return cmp.Compare(a.dbPerRow(), b.dbPerRow()) })
	shallow := shallows[len(shallows)/2]
	deep := outage(long)
	close(stop)
	wg.Wait()
	require.NoError(t, perr, "deep-backlog producer")
	for _, c := range shallows {
		fmt.Printf("chaos: deep backlog: after a %s outage %s\n", deepShallowOutage, c)
	}
	fmt.Printf("chaos: deep backlog: after a %s outage %s\n", long, deep)
	fmt.Printf("chaos: deep backlog: after the long outage against the short ones' median: drain rate %.2f×, database CPU per row %.2f×, relay CPU per row %.2f×\n",
		(float64(deep.backlog)/deep.took.Seconds())/(float64(shallow.backlog)/shallow.took.Seconds()),
		float64(deep.dbPerRow())/float64(shallow.dbPerRow()), float64(deep.relayPerRow())/float64(shallow.relayPerRow()))
	require.Greater(t, deep.backlog, 4*shallow.backlog, "the long outage left a deeper backlog")
	ratio := float64(deep.dbPerRow()) / float64(shallow.dbPerRow())
	require.LessOrEqual(t, ratio, deepMaxCostRatio,
		"the relays' database CPU per row drained after a %s outage is %.2f× the median after a %s outage", long, ratio, deepShallowOutage)
	mu.Lock()
	defer mu.Unlock()
	return seqs
}

// cpuMeter sums the CPU time of a set of processes (the relays and their PostgreSQL backends)
// from /proc, sampling often enough to see backends that exit before it stops.
type cpuMeter struct {
	done chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	// first and last CPU time seen per pid (first is 0 for a process that started after the
	// meter); backend marks the PostgreSQL backends.
	first, last map[int]time.Duration
	backend     map[int]bool
}

// startCPUMeter meters the processes relays returns and every backend whose application_name
// is a relay's of db's schema.
func startCPUMeter(t *testing.T, db *testenv.DB, relays func() []int) *cpuMeter {
	m := &cpuMeter{done: make(chan struct{}), first: map[int]time.Duration{}, last: map[int]time.Duration{},
		backend: map[int]bool{}}
	pids := func() []int {
		out := relays()
		rows, err := db.Pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE starts_with(application_name, $1)`,
			outbox.SchemaApplicationNamePrefix(db.Schema))
		if err != nil {
			return out
		}
		defer rows.Close()
		for rows.Next() {
			var pid int
			if rows.Scan(&pid) == nil {
				out = append(out, pid)
				m.mu.Lock()
				m.backend[pid] = true
				m.mu.Unlock()
			}
		}
		return out
	}
	sample := func(initial bool) {
		for _, pid := range pids() {
			cpu, ok := procCPU(pid)
			if !ok {
				continue
			}
			m.mu.Lock()
			if _, seen := m.first[pid]; !seen {
				if initial {
					m.first[pid] = cpu
				} else {
					m.first[pid] = 0
				}
			}
			m.last[pid] = cpu
			m.mu.Unlock()
		}
	}
	sample(true)
	require.NotEmpty(t, m.first, "relay processes and backends to meter")
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.done:
				sample(false)
				return
			case <-tick.C:
				sample(false)
			}
		}
	}()
	return m
}

// stop ends the metering and returns the CPU time the relay processes and the backends spent
// since the start.
func (m *cpuMeter) stop() (relays, backends time.Duration) {
	close(m.done)
	m.wg.Wait()
	for pid, last := range m.last {
		if m.backend[pid] {
			backends += last - m.first[pid]
		} else {
			relays += last - m.first[pid]
		}
	}
	return relays, backends
}

// procCPU returns the user and system CPU time process pid has used.
func procCPU(pid int) (time.Duration, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name is in parentheses and may hold spaces: fields count from its end.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks, true
}
