package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

const (
	restartKeys  = 50
	restartBatch = 5
	// restartStep is how many more events are committed before each restart and after the
	// last one.
	restartStep = 300
	// restartCeiling bounds every wait on the relay: generous, since a stalled relay is the
	// failure it reports.
	restartCeiling = 2 * time.Minute
)

// The relay's log line of a replication session started (once at start, once per reconnect).
const replicatingLine = `msg="log mode: replicating"`

// TestLogModePostgresRestart: a log-mode relay binary follows the slot of a private cluster
// while a producer enqueues events of many keys; the cluster is restarted twice mid-stream
// (pg_ctl restart -m fast, then -m immediate: a crash). The relay must reconnect after each
// (a new replication session, logged) and replay from the confirmed position: every committed
// event reaches the topic, and each key's records, first copies only (at least once), are in
// commit order.
func TestLogModePostgresRestart(t *testing.T) {
	ctx := context.Background()
	pg := startPGCluster(t)
	db := testenv.NewDBWith(t, testenv.DBConfig{URL: pg.URL})
	kc := testenv.NewKafka(t)
	topic := kc.Topic("e2e.pgrestart.v1")
	kc.CreateTopic(t, topic, 3)

	relay := startProc(t, "relay", relayBin, relayAddrRe, []string{
		"KEIRO_RELAY_DATABASE_URL=" + pg.URL,
		"KEIRO_RELAY_SCHEMA=" + db.Schema,
		"KEIRO_RELAY_BROKERS=" + strings.Join(kc.Seeds, ","),
		"KEIRO_RELAY_HTTP_ADDR=127.0.0.1:0",
		"KEIRO_RELAY_MODE=log",
		"KEIRO_RELAY_POLL_INTERVAL=200ms",
		"KEIRO_RELAY_BACKOFF_INITIAL=100ms",
		"KEIRO_RELAY_BACKOFF_MAX=1s",
		"KEIRO_RELAY_SHUTDOWN_TIMEOUT=5s",
	})
	// sessions waits until the relay has logged at least n replication sessions.
	sessions := func(n int, after string) {
		t.Helper()
		for deadline := time.Now().Add(restartCeiling); ; {
			if strings.Count(relay.log(), replicatingLine) >= n {
				return
			}
			select {
			case <-relay.done:
				t.Fatalf("the relay exited (code %d) %s:\n%s", relay.exitCode(), after, tail(relay.log(), 40))
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("the relay did not start replication session %d within %s %s (it did not reconnect):\n%s",
					n, restartCeiling, after, tail(relay.log(), 40))
			}
			time.Sleep(50 * time.Millisecond) // polling another process's log
		}
	}
	sessions(1, "after its start")

	// The topic, read from the start while the test runs.
	cl := kc.NewClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var (
		rmu  sync.Mutex
		seen = map[string]bool{}     // message id → read
		got  = map[string][]string{} // key → message ids, first copies, in topic order
		dups int
	)
	readCtx, stopRead := context.WithCancel(ctx)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for readCtx.Err() == nil {
			fs := cl.PollFetches(readCtx)
			rmu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				id := headerValue(r, envelope.HeaderMessageID)
				if seen[id] {
					dups++
					return
				}
				seen[id] = true
				got[string(r.Key)] = append(got[string(r.Key)], id)
			})
			rmu.Unlock()
		}
	}()
	t.Cleanup(func() { stopRead(); <-readDone })

	// The producer: batches of events over many keys, each key numbered in commit order. A
	// batch that fails (the server restarting) is retried with the same message ids until it
	// commits; if an attempt whose commit failed had committed after all, the retry is a
	// duplicate the outbox drops, so each id is committed once and the order is unambiguous.
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	var (
		pmu        sync.Mutex
		committed  []string                // message ids, in commit order
		want       = map[string][]string{} // key → message ids in commit order
		retries    int
		stopProd   = make(chan struct{})
		prodDone   = make(chan struct{})
		progressed = make(chan struct{}, 1)
	)
	go func() {
		defer close(prodDone)
		rng := rand.New(rand.NewPCG(1, 2))
		seqs := map[string]int{}
		for b := 0; ; b++ {
			select {
			case <-stopProd:
				return
			default:
			}
			evs := make([]envelope.Event, 0, restartBatch)
			for range restartBatch {
				k := fmt.Sprintf("key-%02d", rng.IntN(restartKeys))
				seqs[k]++
				evs = append(evs, keyedEvent(topic, k, int64(seqs[k])))
			}
			for {
				err := enqueue(ctx, db.Pool, ob, evs...)
				if err == nil {
					break
				}
				pmu.Lock()
				retries++
				pmu.Unlock()
				select {
				case <-stopProd:
					// Unknown outcome, never confirmed: not counted.
					return
				case <-time.After(100 * time.Millisecond): // the server is restarting
				}
			}
			pmu.Lock()
			for _, e := range evs {
				committed = append(committed, e.MessageID)
				want[*e.Key] = append(want[*e.Key], e.MessageID)
			}
			pmu.Unlock()
			select {
			case progressed <- struct{}{}:
			default:
			}
		}
	}()
	committedCount := func() int { pmu.Lock(); defer pmu.Unlock(); return len(committed) }
	// waitCommitted waits until the producer committed n events since the test began.
	waitCommitted := func(n int, what string) {
		t.Helper()
		timeout := time.After(restartCeiling)
		for committedCount() < n {
			select {
			case <-progressed:
			case <-timeout:
				t.Fatalf("the producer committed %d of %d events within %s %s", committedCount(), n, restartCeiling, what)
			}
		}
	}

	waitCommitted(restartStep, "before the first restart")
	pg.restart(t, "fast")
	waitCommitted(committedCount()+restartStep, "after the fast restart")
	sessions(2, "after pg_ctl restart -m fast")
	pg.restart(t, "immediate")
	require.Contains(t, pg.serverLogAll(), "automatic recovery in progress", "-m immediate is a crash: the server recovers from the WAL")
	waitCommitted(committedCount()+restartStep, "after the immediate restart (a crash)")
	sessions(3, "after pg_ctl restart -m immediate")
	close(stopProd)
	<-prodDone

	// Every committed event must reach the topic.
	pmu.Lock()
	all := slices.Clone(committed)
	pmu.Unlock()
	missing := func() []string {
		rmu.Lock()
		defer rmu.Unlock()
		var m []string
		for _, id := range all {
			if !seen[id] {
				m = append(m, id)
			}
		}
		return m
	}
	for deadline := time.Now().Add(restartCeiling); len(missing()) > 0; {
		select {
		case <-relay.done:
			t.Fatalf("the relay exited (code %d) with %d committed events not on the topic:\n%s",
				relay.exitCode(), len(missing()), tail(relay.log(), 40))
		default:
		}
		if time.Now().After(deadline) {
			m := missing()
			t.Fatalf("%d of %d committed events did not reach the topic within %s of the producer's end (first %v); relay log:\n%s",
				len(m), len(all), restartCeiling, m[:min(5, len(m))], tail(relay.log(), 40))
		}
		time.Sleep(50 * time.Millisecond) // polling the reader's progress
	}

	rmu.Lock()
	defer rmu.Unlock()
	for k, ids := range want {
		// The topic may hold ids committed by an attempt the producer saw fail (at most one
		// batch, the one cut by stopProd); those are not in want and are skipped.
		var inOrder []string
		wanted := map[string]bool{}
		for _, id := range ids {
			wanted[id] = true
		}
		for _, id := range got[k] {
			if wanted[id] {
				inOrder = append(inOrder, id)
			}
		}
		require.Equal(t, ids, inOrder, "key %s: first copies on the topic in commit order", k)
	}
	log := relay.log()
	t.Logf("pg restart: %d events committed over %d keys, %d producer retries, %d duplicate records (replayed), %d replication sessions",
		len(all), len(want), retries, dups, strings.Count(log, replicatingLine))
	require.Equal(t, 0, relay.term(t, 30*time.Second), "relay exit code after SIGTERM:\n%s", tail(relay.log(), 30))
}

// headerValue is the value of the record's header key ("" if absent).
func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
