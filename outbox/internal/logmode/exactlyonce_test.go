package logmode_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
	"github.com/keiro-go/keiro/outbox/internal/logmode"
)

// eoFixture is a fixture whose engines publish exactly once.
func eoFixture(t *testing.T, partitions int32) *fixture {
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}, Partitions: partitions})
	f.cfg.ExactlyOnce = &exactlyonce.Config{}
	return f
}

// committedRecords reads topic as a read_committed reader does, up to the end offsets of the
// moment: the records of committed transactions, by partition and offset.
func committedRecords(t *testing.T, f *fixture, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(f.kafka.Client).ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	want := map[int32]int64{}
	parts := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		require.NoError(t, o.Err)
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
			parts[o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	if len(want) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.kafka.Seeds...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	require.NoError(t, err)
	defer cl.Close()
	var out []*kgo.Record
	// Every transaction ends with a control record: the offsets read reach the end offsets
	// once every transaction before them ended, aborted ones included.
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "read %s up to its end offsets", topic)
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
			if r.Offset+1 >= want[r.Partition] {
				delete(want, r.Partition)
			}
		})
	}
	slices.SortStableFunc(out, func(a, b *kgo.Record) int {
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	return out
}

// requireExactlyOnce checks that a read_committed reader of "orders" sees each of want once,
// each key's events in their order in want.
func requireExactlyOnce(t *testing.T, f *fixture, want []event) {
	t.Helper()
	recs := committedRecords(t, f, "orders")
	got := ids(recs)
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	for id, n := range seen {
		require.Equal(t, 1, n, "event %s seen %d times", id, n)
	}
	require.Len(t, got, len(want), "every event once")
	byKey := map[string][]string{}
	for i, r := range recs {
		byKey[string(r.Key)] = append(byKey[string(r.Key)], got[i])
	}
	wantByKey := map[string][]string{}
	for _, e := range want {
		wantByKey[e.key] = append(wantByKey[e.key], e.id)
	}
	require.Equal(t, wantByKey, byKey, "each key's events in order")
}

// writeEvents commits txns transactions of per events each, over keys keys, with ids prefixed
// by prefix, and returns them in commit order.
func writeEvents(t *testing.T, f *fixture, prefix string, txns, per, keys int) []event {
	var all []event
	for i := range txns {
		evs := make([]event, per)
		for j := range evs {
			evs[j] = event{id: fmt.Sprintf("%s-%03d-%03d", prefix, i, j), dest: "orders", key: fmt.Sprintf("k%d", (i*per+j)%keys)}
		}
		commitEvents(t, f.db.Pool, evs...)
		all = append(all, evs...)
	}
	return all
}

// kafkaPositions follows the Kafka commits of engines (OnKafkaCommit) and PostgreSQL's
// (OnCommit), to wait until Kafka holds every transaction written.
type kafkaPositions struct {
	kafka, pg testenv.Progress
}

func (p *kafkaPositions) hooks(h logmode.Hooks) logmode.Hooks {
	h.OnKafkaCommit = func(pos pglogrepl.LSN) { p.kafka.Set(max(p.kafka.Value(), int64(pos))) }
	h.OnCommit = func(end pglogrepl.LSN) { p.pg.Set(max(p.pg.Value(), int64(end))) }
	return h
}

// waitCommitted waits until Kafka committed through the end of the last transaction before
// lsn (a WAL position read after it committed).
func (p *kafkaPositions) waitCommitted(t *testing.T, lsn pglogrepl.LSN) {
	t.Helper()
	p.pg.Wait(t, 1, time.Minute, nil)
	testenv.WaitFor(t, time.Minute, "Kafka holds every transaction written", func() bool {
		pg := p.pg.Value()
		return pg > 0 && p.kafka.Value() >= pg && pg <= int64(lsn) // the last Commit read is the last written
	})
}

// The engine publishes in Kafka transactions: a read_committed reader sees each event once,
// each key's in order, and the offsets topic holds the slot's position: the end of the last
// transaction.
func TestExactlyOnceEachEventOnce(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 2)
	var pos kafkaPositions
	var lastCommit atomic.Uint64
	h := pos.hooks(logmode.Hooks{})
	onCommit := h.OnCommit
	h.OnCommit = func(end pglogrepl.LSN) { lastCommit.Store(uint64(end)); onCommit(end) }
	e := f.newEngine(t, f.cfg, h)
	run(t, e)
	want := writeEvents(t, f, "e", 20, 25, 7)
	pos.pg.Wait(t, int64(walLSN(t, f))-1<<20, time.Minute, nil) // any commit read
	testenv.WaitFor(t, time.Minute, "every transaction committed to Kafka", func() bool {
		return len(committedRecords(t, f, "orders")) >= len(want)
	})
	requireExactlyOnce(t, f, want)

	txnID, counters := e.ExactlyOnce()
	require.Contains(t, txnID, "keiro-relay-log.")
	require.Positive(t, counters.Committed())
	require.Zero(t, counters.Aborted())
	p, err := exactlyonce.ReadPosition(context.Background(), []kgo.Opt{kgo.SeedBrokers(f.kafka.Seeds...)},
		exactlyonce.DefaultOffsetsTopic, txnID)
	require.NoError(t, err)
	require.Equal(t, lastCommit.Load(), p.LSN, "the position is the last transaction's end")
	require.Equal(t, f.db.Schema+"_keiro_log", p.Slot)
}

// An engine that died after its Kafka commits and before any status update left the slot
// behind Kafka: the next engine replays from the slot, skips what Kafka holds, and publishes
// only the events after.
func TestExactlyOnceSlotBehindKafka(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 1)
	var pos kafkaPositions
	first := f.newEngine(t, f.cfg, pos.hooks(logmode.Hooks{HoldReports: true}))
	stop := run(t, first)
	before := writeEvents(t, f, "before", 10, 10, 3)
	testenv.WaitFor(t, time.Minute, "the first engine committed every event", func() bool {
		return len(committedRecords(t, f, "orders")) >= len(before)
	})
	stop()
	confirmed := slotConfirmed(t, f)
	lsn, err := pglogrepl.ParseLSN(confirmed)
	require.NoError(t, err)
	require.Less(t, uint64(lsn), uint64(pos.kafka.Value()), "the slot lags behind Kafka")

	var acked atomic.Int64
	var pos2 kafkaPositions
	second := f.newEngine(t, f.cfg, pos2.hooks(logmode.Hooks{OnAck: func(string) { acked.Add(1) }}))
	run(t, second)
	after := writeEvents(t, f, "later", 3, 10, 3)
	testenv.WaitFor(t, time.Minute, "the second engine committed the events after", func() bool {
		return len(committedRecords(t, f, "orders")) >= len(before)+len(after)
	})
	requireExactlyOnce(t, f, append(before, after...))
	require.Equal(t, int64(len(after)), acked.Load(), "the second engine produced only the events after")
}

// A zombie: engine A lost the slot while its Kafka transaction was open (held before its
// commit); B took the slot over, fenced A's transactional id (aborting A's transaction) and
// published the events. A's commit then fails as fenced, and A goes back on standby: a
// read_committed reader sees each event once.
func TestExactlyOnceFencesAZombie(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 1)
	blocked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var standbyA atomic.Int64
	activeA := make(chan struct{}, 1)
	a := f.newEngine(t, f.cfg, logmode.Hooks{
		OnActive: func() {
			select {
			case activeA <- struct{}{}:
			default:
			}
		},
		BeforeKafkaCommit: func(pglogrepl.LSN) {
			once.Do(func() {
				close(blocked)
				<-release
			})
		},
		OnStandby: func(int) { standbyA.Add(1) },
	})
	run(t, a)
	<-activeA
	first := writeEvents(t, f, "first", 2, 5, 2)
	<-blocked // A produced the records in its transaction and holds before the commit

	var standbyB atomic.Int64
	activeB := make(chan struct{})
	var activeOnce sync.Once
	var posB kafkaPositions
	b := f.newEngine(t, f.cfg, posB.hooks(logmode.Hooks{
		OnStandby: func(int) { standbyB.Add(1) },
		OnActive:  func() { activeOnce.Do(func() { close(activeB) }) },
	}))
	run(t, b)
	testenv.WaitFor(t, time.Minute, "B waits on standby", func() bool { return standbyB.Load() > 0 })
	// A's replication connection is ended under it (as wal_sender_timeout ends a frozen
	// reader's): B takes the slot over.
	_, err := f.db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE slot_name = $1 AND active_pid IS NOT NULL`, f.db.Schema+"_keiro_log")
	require.NoError(t, err)
	<-activeB
	testenv.WaitFor(t, time.Minute, "B published the events A held", func() bool {
		return len(committedRecords(t, f, "orders")) >= len(first)
	})
	close(release) // A commits now, fenced
	_, countersA := a.ExactlyOnce()
	testenv.WaitFor(t, time.Minute, "A found itself fenced", func() bool { return countersA.Fenced() > 0 })
	testenv.WaitFor(t, time.Minute, "A is back on standby", func() bool { return standbyA.Load() > 0 })
	require.Zero(t, countersA.Committed())

	second := writeEvents(t, f, "second", 2, 5, 2)
	testenv.WaitFor(t, time.Minute, "B published the events after", func() bool {
		return len(committedRecords(t, f, "orders")) >= len(first)+len(second)
	})
	requireExactlyOnce(t, f, append(first, second...))
	txnA, _ := a.ExactlyOnce()
	txnB, _ := b.ExactlyOnce()
	require.Equal(t, txnA, txnB, "one transactional id per slot")
}

// A record that fails in a Kafka transaction aborts it: the session ends, the next replays
// from the position Kafka holds (the failed request's records produced alone, as suspects),
// and a read_committed reader sees each event once.
func TestExactlyOnceReplaysAnAbortedTransaction(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 1)
	var refused atomic.Int64
	var failOnce atomic.Bool
	failOnce.Store(true)
	f.kafka.Cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.kafka.Cluster.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		// The first produce request: the transaction's first records, and maybe its
		// position record (a request may name its topics by id only).
		if !failOnce.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		refused.Add(1)
		return testenv.ProduceError(req, kerr.MessageTooLarge.Code), nil, true
	})
	e := f.newEngine(t, f.cfg, logmode.Hooks{})
	run(t, e)
	want := writeEvents(t, f, "e", 5, 8, 3)
	testenv.WaitFor(t, time.Minute, "every event committed", func() bool {
		return len(committedRecords(t, f, "orders")) >= len(want)
	})
	requireExactlyOnce(t, f, want)
	require.Equal(t, int64(1), refused.Load())
	_, counters := e.ExactlyOnce()
	require.Positive(t, counters.Aborted(), "the failed transaction was aborted")
	require.GreaterOrEqual(t, e.Sessions(), int64(2), "a session replayed it")
	require.Zero(t, e.Stats().Rejected, "a suspect that goes through alone is not rejected")
}

