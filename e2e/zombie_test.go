package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// zombieLinger keeps a relay's transaction open while events keep coming, so that the relay
// can be stopped with records produced in a transaction it has not committed.
const zombieLinger = 2 * time.Second

// TestExactlyOnceZombie: relay A publishes with --exactly-once while events trickle in and is
// stopped (SIGSTOP) while a transaction of its, with records on the topic, is open. Relay B
// takes A's work over — claim mode: A's claims once their lease expired; log mode: the slot,
// once A's replication connection was terminated while A was stopped — and publishes
// everything. Then A is continued, a zombie with a transaction to commit: it must be fenced
// (it says so), and a read_committed reader (ours and librdkafka's) sees every event exactly
// once: nothing A produced is visible.
func TestExactlyOnceZombie(t *testing.T) {
	t.Parallel()
	requirePython(t)
	for _, mode := range []string{"claim", "log"} {
		t.Run(mode, func(t *testing.T) { testExactlyOnceZombie(t, mode) })
	}
}

func testExactlyOnceZombie(t *testing.T, mode string) {
	ctx := context.Background()
	kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true})
	r := newEOSRun(t, kc, mode, "e2e.zombie.v1", 0, "KEIRO_RELAY_LOG_LEVEL=info",
		"KEIRO_RELAY_TRANSACTION_LINGER="+zombieLinger.String())
	r.names = []string{"relay-a", "relay-b"}
	a := r.startRelay(0)
	r.relays = []*proc{a}
	a.waitAddr(t, time.Minute)
	if mode == "log" {
		testenv.WaitFor(t, time.Minute, "relay A streaming the slot", func() bool { return replicatingRe.MatchString(a.log()) })
	}
	r.enqueue(500)
	r.waitPublished("relay A publishing")

	// Events trickle in (20 every 20 ms), so that A's transactions stay open for their linger.
	stop, trickled := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				trickled <- nil
				return
			case <-tick.C:
				if err := r.enqueueBatch(20); err != nil {
					trickled <- err
					return
				}
			}
		}
	}()
	stopTrickle := func() {
		if stop != nil {
			close(stop)
			require.NoError(t, <-trickled)
			stop = nil
		}
	}
	t.Cleanup(func() {
		if stop != nil {
			close(stop)
			if err := <-trickled; err != nil {
				t.Log(err)
			}
		}
	})

	// Stop A while a transaction of its holds records: the topic's last stable offset is below
	// its high watermark. A request A sent just before the stop may still complete: the
	// stopped state is read again once A's requests had time to land, and A is continued
	// and stopped again at a later open transaction if its commit got through.
	var stopped time.Time
	for attempt := 1; ; attempt++ {
		testenv.WaitFor(t, time.Minute, "relay A holding a transaction with records open", func() bool {
			return openTransaction(ctx, r.adm, r.topic)
		})
		require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
		stopped = time.Now()
		time.Sleep(500 * time.Millisecond) // a request in flight lands: the state then holds
		if openTransaction(ctx, r.adm, r.topic) {
			t.Logf("relay A stopped with a transaction open (attempt %d)", attempt)
			break
		}
		require.Less(t, attempt, 10, "relay A stopped with an open transaction")
		require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	}
	stopTrickle()
	committedAtStop := r.reader.distinct()

	// B takes over.
	if mode == "log" {
		r.terminateWalsender()
	}
	b := r.startRelay(1)
	r.relays = append(r.relays, b)
	b.waitAddr(t, time.Minute)
	if mode == "log" {
		testenv.WaitFor(t, 2*time.Minute, "relay B streaming the slot", func() bool { return replicatingRe.MatchString(b.log()) })
	}
	r.enqueue(1000)
	r.waitPublished("relay B publishing what A had open and the rest")
	// A's open transaction was aborted when B fenced A's transactional id: its partitions'
	// last stable offsets moved on.
	r.reader.waitCaughtUp(t, r.adm, time.Minute)
	if d := eosFreeze - time.Since(stopped); d > 0 {
		time.Sleep(d) // A stays stopped past its lease even if B was quicker
	}
	committedBefore := r.reader.records()
	t.Logf("%d events committed when A was stopped, %d when it is continued", committedAtStop, committedBefore)

	// The zombie wakes up with its transaction to commit.
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	testenv.WaitFor(t, time.Minute, "relay A to report that it was fenced", func() bool { return fencedRe.MatchString(a.log()) })
	for _, line := range strings.Split(a.log(), "\n") {
		if fencedRe.MatchString(line) {
			t.Logf("relay A: %s", line)
			break
		}
	}
	if addr := a.waitAddr(t, time.Second); addr != "" {
		if lines := metricLines(addr, "fenced"); len(lines) > 0 {
			t.Logf("relay A's metrics: %s", strings.Join(lines, "; "))
		}
	}
	r.check()
	require.Equal(t, committedBefore, r.reader.records(), "nothing committed once the zombie was continued")
}

// metricLines returns the sample lines of the /metrics page at addr that contain substr.
func metricLines(addr, substr string) []string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return []string{fmt.Sprintf("scrape %s: %v", addr, err)}
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); !strings.HasPrefix(l, "#") && strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}
