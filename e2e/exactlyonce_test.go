package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
	"github.com/keiro-go/keiro/outbox"
)

// Parameters of the exactly-once runs.
const (
	eosEvents     = 20000
	eosKeys       = 200
	eosBatch      = 250 // events per enqueue transaction
	eosPartitions = 6
	eosLease      = 5 * time.Second
	// eosFreeze is how long a relay stays stopped: past its lease, so that its claims are
	// taken over while it is stopped.
	eosFreeze = eosLease + 2*time.Second
	// eosTxnTimeout bounds how long a transaction a killed relay left open holds the
	// read_committed readers of its partitions back (when no successor fences it first).
	eosTxnTimeout = 20 * time.Second
)

// fencedRe matches a relay's report that it was fenced: a producer of its transactional id
// started after it, so nothing it produced since can commit.
var fencedRe = regexp.MustCompile(`(?i)fenced`)

// replicatingRe matches a log-mode relay's line as it starts streaming the slot (it is the
// active relay).
var replicatingRe = regexp.MustCompile(`log mode: replicating`)

// eosBrokerProps are the broker settings exactly-once publication needs on a three-broker
// cluster (docs/operations.md): the transaction state log replicated to every broker and
// written to two, and acks=all meaning two replicas.
var eosBrokerProps = map[string]string{
	"auto.create.topics.enable":                "false",
	"transaction.state.log.replication.factor": "3",
	"transaction.state.log.min.isr":            "2",
	"min.insync.replicas":                      "2",
}

// eosRun is one exactly-once run: the relays of one schema publishing to one topic, the events
// enqueued so far, and a read_committed reader of the topic.
type eosRun struct {
	t        *testing.T
	mode     string
	db       *testenv.DB
	kc       *testenv.Kafka
	adm      *kadm.Client
	ob       *outbox.Store
	topic    string
	slotName string // log mode

	env    []string
	relays []*proc // by relay number: the relay's current process
	names  []string

	want     map[string]int64 // key → events enqueued
	enqueued int
	reader   *committedReader
	zombies  []*proc // the relays continued after a freeze
}

// newEOSRun prepares a run on kc: the topic (partitions led by leader, 0 for the broker's
// choice), the schema, and the relays' environment with exactly-once on.
func newEOSRun(t *testing.T, kc *testenv.Kafka, mode, topicName string, leader int32, extra ...string) *eosRun {
	t.Helper()
	ctx := context.Background()
	r := &eosRun{t: t, mode: mode, kc: kc, adm: kadm.NewClient(kc.Client), topic: kc.Topic(topicName),
		want: map[string]int64{}}
	if leader > 0 {
		createLedBy(t, kc, r.topic, eosPartitions, leader)
	} else {
		kc.CreateTopic(t, r.topic, eosPartitions)
	}
	r.db = testenv.NewDB(t)
	ob, err := outbox.NewStore(r.db.Schema)
	require.NoError(t, err)
	r.ob = ob
	r.env = relayEnv(r.db, kc, append([]string{
		"KEIRO_RELAY_EXACTLY_ONCE=true",
		"KEIRO_RELAY_OFFSETS_TOPIC=" + kc.Topic("keiro-relay-offsets"),
		"KEIRO_RELAY_TRANSACTION_TIMEOUT=" + eosTxnTimeout.String(),
		"KEIRO_RELAY_LEASE=" + eosLease.String(),
		"KEIRO_RELAY_MAX_ATTEMPTS=100",
	}, extra...)...)
	if mode == "log" {
		_, err := r.db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
            WHERE NOT active AND slot_name ~ '^t_[0-9a-f]{12}_keiro_log$'
              AND pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) > 1073741824`)
		if err != nil {
			t.Logf("sweep abandoned test slots: %v", err)
		}
		r.slotName = outbox.DefaultLogSlot(r.db.Schema)
		r.env = append(r.env, "KEIRO_RELAY_MODE=log", "KEIRO_RELAY_LOG_SLOT="+r.slotName)
		t.Cleanup(func() { dropSlot(t, r.db, r.slotName) }) // after the relays' kills
	}
	r.reader = startCommittedReader(t, kc.Seeds, r.topic)
	return r
}

// startRelays starts n relays. In claim mode relay i has the instance id "relay-<i>" (a
// restart fences its previous run at once). In log mode the first relay switches the schema
// and takes the slot before the others start, so that every event is enqueued in log mode and
// the others wait on standby.
func (r *eosRun) startRelays(n int) {
	r.t.Helper()
	for i := range n {
		r.names = append(r.names, fmt.Sprintf("relay-%d", i))
		r.relays = append(r.relays, r.startRelay(i))
		if r.mode == "log" && i == 0 {
			testenv.WaitFor(r.t, time.Minute, "the first log-mode relay streaming the slot", func() bool {
				return replicatingRe.MatchString(r.relays[0].log())
			})
		}
	}
	for _, p := range r.relays {
		p.waitAddr(r.t, time.Minute)
	}
}

func (r *eosRun) startRelay(i int) *proc {
	env := r.env
	if r.mode == "claim" {
		env = append(env[:len(env):len(env)], "KEIRO_RELAY_INSTANCE_ID="+r.names[i])
	}
	return startProc(r.t, r.names[i], relayBin, relayAddrRe, env)
}

// enqueue enqueues n events (a multiple of eosBatch), key i%eosKeys for the run's i-th event.
func (r *eosRun) enqueue(n int) {
	r.t.Helper()
	for range n / eosBatch {
		require.NoError(r.t, r.enqueueBatch(eosBatch))
	}
}

// enqueueBatch enqueues the run's next n events in one transaction.
func (r *eosRun) enqueueBatch(n int) error {
	evs := make([]envelope.Event, 0, n)
	for range n {
		key := fmt.Sprintf("key-%03d", r.enqueued%eosKeys)
		r.enqueued++
		r.want[key]++
		evs = append(evs, keyedEvent(r.topic, key, r.want[key]))
	}
	return enqueue(context.Background(), r.db.Pool, r.ob, evs...)
}

// waitPublished waits until the reader saw every event enqueued so far committed.
func (r *eosRun) waitPublished(what string) {
	r.t.Helper()
	n := r.enqueued
	deadline := time.Now().Add(3 * time.Minute)
	for r.reader.distinct() < n {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %s: %d of %d events committed on the topic%s\n%s",
				what, r.reader.distinct(), n, r.reader.positions(r.adm), r.logs())
		}
		time.Sleep(20 * time.Millisecond) // polling the reader: the tick only bounds the rate
	}
}

// waitProgress waits until the reader saw at least n more events than from committed: the
// relays are mid-stream.
func (r *eosRun) waitProgress(from, n int, what string) {
	r.t.Helper()
	testenv.WaitFor(r.t, 3*time.Minute, what, func() bool { return r.reader.distinct() >= min(from+n, r.enqueued) })
}

// active is the number of the relay that should be killed or stopped: in log mode the one
// that most recently started streaming the slot, in claim mode relay i%len.
func (r *eosRun) active(i int) int {
	if r.mode != "log" {
		return i % len(r.relays)
	}
	// The active relay is the running one whose latest "replicating" line is the newest: a
	// relay that lost the slot does not stream again until it logs the line again.
	best, bestAt := -1, time.Time{}
	for j, p := range r.relays {
		select {
		case <-p.done:
			continue
		default:
		}
		if at := lastLineTime(p.log(), replicatingRe); !at.IsZero() && at.After(bestAt) {
			best, bestAt = j, at
		}
	}
	require.GreaterOrEqual(r.t, best, 0, "no log-mode relay streaming\n%s", r.logs())
	return best
}

// streamCounts is, per relay number, how many times its current process started streaming.
func (r *eosRun) streamCounts() []int {
	out := make([]int, len(r.relays))
	for j, p := range r.relays {
		out[j] = len(replicatingRe.FindAllStringIndex(p.log(), -1))
	}
	return out
}

// waitTakeover waits (log mode) until a relay other than victim started streaming since
// before (streamCounts).
func (r *eosRun) waitTakeover(victim int, before []int, what string) {
	r.t.Helper()
	if r.mode != "log" {
		return
	}
	testenv.WaitFor(r.t, 2*time.Minute, what, func() bool {
		now := r.streamCounts()
		for j := range now {
			if j != victim && now[j] > before[j] {
				return true
			}
		}
		return false
	})
}

// kill SIGKILLs relay i and starts it again.
func (r *eosRun) kill(i int) {
	r.t.Helper()
	before := r.streamCounts()
	r.relays[i].kill()
	r.relays[i] = r.startRelay(i)
	before[i] = 0
	r.waitTakeover(-1, before, "a relay streaming the slot after the active one was killed")
}

// holder waits until a relay holds a Kafka transaction open with records (the topic's last
// stable offset is below its high watermark) and returns it: in log mode the active relay, in
// claim mode a relay whose claim holds rows (their claim_txn names its transactional id). When
// the relays drain what was enqueued before that is seen, 500 more events are enqueued, twice;
// then it settles for fallback.
func (r *eosRun) holder(fallback int) int {
	r.t.Helper()
	ctx := context.Background()
	for range 3 {
		found := -1
		deadline := time.Now().Add(time.Minute)
		for ; found < 0 && r.reader.distinct() < r.enqueued && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if !openTransaction(ctx, r.adm, r.topic) {
				continue
			}
			if r.mode == "log" {
				found = r.active(0)
				break
			}
			rows, err := r.db.Pool.Query(ctx, `SELECT DISTINCT claim_txn FROM `+r.db.Schema+`.keiro_outbox
                WHERE status = 'publishing' AND claim_txn IS NOT NULL`)
			require.NoError(r.t, err)
			for rows.Next() {
				var txn string
				require.NoError(r.t, rows.Scan(&txn))
				for j, name := range r.names {
					if strings.HasSuffix(txn, "."+name) {
						found = j
					}
				}
			}
			require.NoError(r.t, rows.Err())
		}
		if found >= 0 {
			return found
		}
		r.enqueue(500)
	}
	r.t.Logf("no relay seen holding a transaction open; freezing %s", r.names[fallback])
	return fallback
}

// freeze stops relay i (SIGSTOP) past its lease while the others publish what it had claimed
// and what is enqueued meanwhile (n events), then continues it: a zombie. In log mode its
// replication connection is terminated while it is stopped (a stopped relay otherwise keeps
// the slot until wal_sender_timeout), so that a standby takes the slot over.
func (r *eosRun) freeze(i, n int) {
	r.t.Helper()
	p := r.relays[i]
	r.zombies = append(r.zombies, p)
	before := r.streamCounts()
	require.NoError(r.t, p.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	if r.mode == "log" {
		r.terminateWalsender()
		r.waitTakeover(i, before, "a standby streaming the slot of the stopped relay")
	}
	r.enqueue(n)
	r.waitPublished(fmt.Sprintf("the events published while %s is stopped", p.name))
	// The freeze lasts past the lease whatever the machine's speed: the rows the stopped relay
	// had claimed are taken over only once its lease expired, and were published above.
	if d := eosFreeze - time.Since(stopped); d > 0 {
		time.Sleep(d)
	}
	require.NoError(r.t, p.cmd.Process.Signal(syscall.SIGCONT))
}

// terminateWalsender terminates the backend streaming the run's slot.
func (r *eosRun) terminateWalsender() {
	r.t.Helper()
	var pid *int32
	require.NoError(r.t, r.db.Pool.QueryRow(context.Background(),
		`SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, r.slotName).Scan(&pid))
	if pid == nil {
		r.t.Logf("the slot %s is not streamed at the moment: nothing to terminate", r.slotName)
		return
	}
	var ok bool
	require.NoError(r.t, r.db.Pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, *pid).Scan(&ok))
	require.True(r.t, ok, "terminate the walsender %d", *pid)
}

func (r *eosRun) logs() string {
	var b strings.Builder
	for _, p := range r.relays {
		fmt.Fprintf(&b, "--- %s\n%s\n", p.name, tail(p.log(), 25))
	}
	return b.String()
}

// check waits until the reader reached the end offsets and every relay is idle, then checks
// that our read_committed reader and librdkafka's (Python) saw each event exactly once, in
// per-key order, at the same offsets; in claim mode, that no outbox row is left unsent.
func (r *eosRun) check() []committedRecord {
	r.t.Helper()
	ctx := context.Background()
	r.waitPublished("every event committed on the topic")
	r.reader.waitCaughtUp(r.t, r.adm, 2*time.Minute)
	if r.mode == "claim" {
		testenv.WaitFor(r.t, 2*time.Minute, "every outbox row marked sent", func() bool {
			var open int64
			require.NoError(r.t, r.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+r.db.Schema+`.keiro_outbox WHERE status <> 'sent'`).Scan(&open))
			return open == 0
		})
	}
	ours := fromKgo(r.reader.snapshot())
	ends, err := r.adm.ListEndOffsets(ctx, r.topic)
	require.NoError(r.t, err)
	var hwm int64
	ends.Each(func(l kadm.ListedOffset) { hwm += l.Offset })
	fmt.Printf("exactly once (%s mode): %d events, %d committed records read (read_committed), %d offsets on the topic "+
		"(commit and abort markers and aborted records included)\n", r.mode, r.enqueued, len(ours), hwm)
	require.Empty(r.t, exactlyOnceViolations(ours, r.want), "our read_committed reader: each event once, in per-key order")
	require.Len(r.t, ours, r.enqueued)

	py := pythonCommitted(r.t, r.kc.Seeds, r.topic)
	require.Empty(r.t, exactlyOnceViolations(py, r.want), "librdkafka's read_committed reader: each event once, in per-key order")
	require.Len(r.t, py, r.enqueued)
	require.Empty(r.t, samePositions(ours, py), "both readers read each event at the same offset")
	return ours
}

// TestExactlyOnceThreeBrokers publishes 20,000 events over 200 keys with --exactly-once to a
// real three-broker cluster (transaction state log replicated three times, min.insync.replicas
// and transaction.state.log.min.isr 2), in each relay mode, while
//
//  1. the relay publishing is SIGKILLed and restarted, three times;
//  2. it is stopped (SIGSTOP) past its lease while another relay takes its work over (log
//     mode: its replication connection is terminated meanwhile, and the standby takes the
//     slot), then continued, twice: a zombie, which must be fenced;
//  3. the broker leading the topic's partitions is SIGKILLed (leadership moves; it may also be
//     the relays' transaction coordinator), then restarted;
//  4. a last relay is killed while the rest flows.
//
// Every phase moves on when something happened (events committed on the topic, a standby
// streaming, leadership moved), never after a fixed time. At the end a read_committed reader
// of ours (franz-go) and librdkafka's (Python binding) read the topic to its end offsets:
// each event exactly once, in per-key order, at the same offsets for both.
func TestExactlyOnceThreeBrokers(t *testing.T) {
	requirePython(t)
	for _, mode := range []string{"claim", "log"} {
		t.Run(mode, func(t *testing.T) { testExactlyOnceThreeBrokers(t, mode) })
	}
}

func testExactlyOnceThreeBrokers(t *testing.T, mode string) {
	began := time.Now()
	ctx := context.Background()
	c, err := kafkabroker.Start(ctx, kafkabroker.Config{Brokers: 3, Props: eosBrokerProps})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true, Brokers: c.Seeds()})
	r := newEOSRun(t, kc, mode, "e2e.eos.v1", 1, "KEIRO_RELAY_LOG_LEVEL=info")
	r.startRelays(2)
	phase := func(name string, t0 time.Time) {
		t.Logf("%s: %s (%d events enqueued, %d committed)", name, time.Since(t0).Round(100*time.Millisecond), r.enqueued, r.reader.distinct())
	}

	t0 := time.Now()
	r.enqueue(2000)
	r.waitPublished("the first events")
	phase("warm-up", t0)

	// 1. SIGKILL, three times, while events flow.
	t0 = time.Now()
	for i := range 3 {
		from := r.reader.distinct()
		r.enqueue(1500)
		r.waitProgress(from, 200, "events flowing before a kill")
		r.kill(r.active(i))
		r.waitPublished("the events enqueued around a relay's kill")
	}
	phase("relay kills", t0)

	// 2. SIGSTOP past the lease, twice: a zombie each time.
	t0 = time.Now()
	for i := range 2 {
		r.enqueue(1500)
		r.freeze(r.holder(r.active(i)), 1500)
		r.waitPublished("the events after a zombie continued")
	}
	phase("relay freezes", t0)

	// 3. The broker leading the partitions is killed, then restarted.
	t0 = time.Now()
	from := r.reader.distinct()
	r.enqueue(2000)
	r.waitProgress(from, 200, "events flowing before the leader's kill")
	leader := c.Broker(leaders(t, kc, r.topic)[0])
	require.NoError(t, leader.Kill())
	r.enqueue(2000)
	testenv.WaitFor(t, 2*time.Minute, "leadership moved off the killed broker", func() bool {
		ls := leaders(t, kc, r.topic)
		return len(ls) == eosPartitions && !slices.Contains(ls, leader.ID) && !slices.Contains(ls, -1)
	})
	r.waitPublished("the events enqueued with the leader killed")
	require.NoError(t, leader.Restart(ctx))
	require.NoError(t, c.WaitReady(ctx))
	phase("leader kill", t0)

	// 4. The rest, with a last kill.
	t0 = time.Now()
	from = r.reader.distinct()
	rest := eosEvents - r.enqueued
	r.enqueue(rest / 2 / eosBatch * eosBatch)
	r.waitProgress(from, 200, "events flowing before the last kill")
	r.kill(r.active(1))
	r.enqueue(eosEvents - r.enqueued)
	require.Equal(t, eosEvents, r.enqueued)
	r.check()
	phase("last kill and checks", t0)

	// A zombie that resumes with a transaction to commit, or records to produce, is fenced;
	// one stopped between two transactions may have nothing to report.
	var fenced []string
	for _, p := range r.zombies {
		if fencedRe.MatchString(p.log()) {
			fenced = append(fenced, p.name)
		}
	}
	t.Logf("%s mode: %s in all; %d zombies, fenced by their successors (as they report): %v", mode,
		time.Since(began).Round(time.Second), len(r.zombies), fenced)
}

// lastLineTime is the time of the last line of log matching re (zero if none, or if the line
// has no time field).
func lastLineTime(log string, re *regexp.Regexp) time.Time {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !re.MatchString(lines[i]) {
			continue
		}
		if m := timeFieldRe.FindStringSubmatch(lines[i]); m != nil {
			if at, err := time.Parse(time.RFC3339Nano, m[1]+m[2]); err == nil {
				return at
			}
		}
		return time.Time{}
	}
	return time.Time{}
}

// timeFieldRe is the time field of a log line, in the text or the JSON format.
var timeFieldRe = regexp.MustCompile(`^time=(\S+)|"time":"([^"]+)"`)
