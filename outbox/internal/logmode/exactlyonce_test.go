package logmode_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// eoFixture is a fixture whose engines publish exactly once.
func eoFixture(t *testing.T, partitions int32) *fixture {
	return eoFixtureOn(t, testenv.NewKafkaWith(t, testenv.KafkaConfig{Topics: []string{"orders"}, Partitions: partitions}))
}

// eoFixtureOn is eoFixture on kafka, which has the topic "orders" (kafka.Topic).
func eoFixtureOn(t *testing.T, kafka *testenv.Kafka) *fixture {
	f := newFixtureOn(t, kafka)
	f.cfg.ExactlyOnce = &exactlyonce.Config{OffsetsTopic: kafka.Topic(exactlyonce.DefaultOffsetsTopic)}
	return f
}

// orders is the name of the topic "orders" on the fixture's Kafka.
func (f *fixture) orders() string { return f.kafka.Topic("orders") }

// readPosition reads txnID's position from the fixture's offsets topic.
func (f *fixture) readPosition(t *testing.T, txnID string) exactlyonce.Position {
	t.Helper()
	p, err := exactlyonce.ReadPosition(context.Background(), []kgo.Opt{kgo.SeedBrokers(f.kafka.Seeds...)},
		f.cfg.ExactlyOnce.OffsetsTopic, txnID)
	require.NoError(t, err)
	return p
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
	recs := committedRecords(t, f, f.orders())
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
			evs[j] = event{id: fmt.Sprintf("%s-%03d-%03d", prefix, i, j), dest: f.orders(), key: fmt.Sprintf("k%d", (i*per+j)%keys)}
		}
		commitEvents(t, f.db.Pool, evs...)
		all = append(all, evs...)
	}
	return all
}

// kafkaPosition follows the positions of an engine's Kafka commits (OnKafkaCommit).
type kafkaPosition struct{ testenv.Progress }

func (p *kafkaPosition) hooks(h logmode.Hooks) logmode.Hooks {
	h.OnKafkaCommit = func(pos pglogrepl.LSN) { p.Set(max(p.Value(), int64(pos))) }
	return h
}

// The engine publishes in Kafka transactions: a read_committed reader sees each event once,
// each key's in order, and the offsets topic holds the slot's position: the end of the last
// transaction.
func TestExactlyOnceEachEventOnce(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{Topics: []string{"orders"}, Partitions: 2}, func(t *testing.T, k *testenv.Kafka) {
		eachEventOnce(t, eoFixtureOn(t, k))
	})
}

func eachEventOnce(t *testing.T, f *fixture) {
	var pos kafkaPosition
	var lastCommit atomic.Uint64
	e := f.newEngine(t, f.cfg, pos.hooks(logmode.Hooks{OnCommit: func(end pglogrepl.LSN) { lastCommit.Store(uint64(end)) }}))
	run(t, e)
	want := writeEvents(t, f, "e", 20, 25, 7)
	testenv.WaitFor(t, time.Minute, "every transaction committed to Kafka", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(want)
	})
	requireExactlyOnce(t, f, want)

	txnID, counters := e.ExactlyOnce()
	require.Contains(t, txnID, "keiro-relay-log.")
	require.Positive(t, counters.Committed())
	require.Zero(t, counters.Aborted())
	pos.Wait(t, int64(lastCommit.Load()), time.Minute, nil)
	p := f.readPosition(t, txnID)
	require.Equal(t, lastCommit.Load(), p.LSN, "the position is the last transaction's end")
	require.Equal(t, f.db.Schema+"_keiro_log", p.Slot)
}

// An engine that died after its Kafka commits and before any status update left the slot
// behind Kafka: the next engine replays from the slot, skips what Kafka holds, and publishes
// only the events after.
func TestExactlyOnceSlotBehindKafka(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{Topics: []string{"orders"}}, func(t *testing.T, k *testenv.Kafka) {
		slotBehindKafka(t, eoFixtureOn(t, k))
	})
}

func slotBehindKafka(t *testing.T, f *fixture) {
	var pos kafkaPosition
	first := f.newEngine(t, f.cfg, pos.hooks(logmode.Hooks{HoldReports: true}))
	stop := run(t, first)
	before := writeEvents(t, f, "before", 10, 10, 3)
	testenv.WaitFor(t, time.Minute, "the first engine committed every event", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(before)
	})
	stop()
	confirmed := slotConfirmed(t, f)
	lsn, err := pglogrepl.ParseLSN(confirmed)
	require.NoError(t, err)
	require.Less(t, uint64(lsn), uint64(pos.Value()), "the slot lags behind Kafka")

	var acked atomic.Int64
	second := f.newEngine(t, f.cfg, logmode.Hooks{OnAck: func(string) { acked.Add(1) }})
	run(t, second)
	after := writeEvents(t, f, "later", 3, 10, 3)
	testenv.WaitFor(t, time.Minute, "the second engine committed the events after", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(before)+len(after)
	})
	requireExactlyOnce(t, f, append(before, after...))
	require.Equal(t, int64(len(after)), acked.Load(), "the second engine produced only the events after")
}

// A zombie: engine A lost the slot while its Kafka transaction was open (held before its
// commit); B took the slot over, fenced A's transactional id (aborting A's transaction) and
// published the events. A's commit then fails as fenced, and A's session ends saying so (its
// lost connection, found at the same moment, does not hide the fencing) and goes back on
// standby: a read_committed reader sees each event once.
func TestExactlyOnceFencesAZombie(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{Topics: []string{"orders"}}, func(t *testing.T, k *testenv.Kafka) {
		fencesAZombie(t, eoFixtureOn(t, k))
	})
}

func fencesAZombie(t *testing.T, f *fixture) {
	blocked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var standbyA atomic.Int64
	var fencedA atomic.Bool
	activeA := make(chan struct{}, 1)
	a := f.newEngine(t, f.cfg, logmode.Hooks{
		OnSessionEnd: func(err error) {
			if errors.Is(err, exactlyonce.ErrFenced) {
				fencedA.Store(true)
			}
		},
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
	b := f.newEngine(t, f.cfg, logmode.Hooks{
		OnStandby: func(int) { standbyB.Add(1) },
		OnActive:  func() { activeOnce.Do(func() { close(activeB) }) },
	})
	run(t, b)
	testenv.WaitFor(t, time.Minute, "B waits on standby", func() bool { return standbyB.Load() > 0 })
	// A's replication connection is ended under it (as wal_sender_timeout ends a frozen
	// reader's): B takes the slot over.
	_, err := f.db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE slot_name = $1 AND active_pid IS NOT NULL`, f.db.Schema+"_keiro_log")
	require.NoError(t, err)
	<-activeB
	testenv.WaitFor(t, time.Minute, "B published the events A held", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(first)
	})
	close(release) // A commits now, fenced
	_, countersA := a.ExactlyOnce()
	testenv.WaitFor(t, time.Minute, "A found itself fenced", func() bool { return countersA.Fenced() > 0 })
	testenv.WaitFor(t, time.Minute, "A is back on standby", func() bool { return standbyA.Load() > 0 })
	require.True(t, fencedA.Load(), "A's session ended as fenced")
	require.Zero(t, countersA.Committed())

	second := writeEvents(t, f, "second", 2, 5, 2)
	testenv.WaitFor(t, time.Minute, "B published the events after", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(first)+len(second)
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
		return len(committedRecords(t, f, f.orders())) >= len(want)
	})
	requireExactlyOnce(t, f, want)
	require.Equal(t, int64(1), refused.Load())
	_, counters := e.ExactlyOnce()
	require.Positive(t, counters.Aborted(), "the failed transaction was aborted")
	require.GreaterOrEqual(t, e.Sessions(), int64(2), "a session replayed it")
	require.Zero(t, e.Stats().Rejected, "a suspect that goes through alone is not rejected")
}

// A record Kafka refuses for good fails its Kafka transaction, which aborts: produced alone by
// the next session, it is refused again, rejected (its dead letter written) and the transaction
// replayed without it. The events around it are each seen once, and the stream moves on.
func TestExactlyOncePoisonRecordIsRejected(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{Topics: []string{"orders", "poison"}}, func(t *testing.T, k *testenv.Kafka) {
		poisonRecordIsRejected(t, eoFixtureOn(t, k))
	})
}

func poisonRecordIsRejected(t *testing.T, f *fixture) {
	ctx := context.Background()
	poison := f.kafka.Topic("poison")
	res, err := kadm.NewClient(f.kafka.Client).AlterTopicConfigs(ctx,
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr("2048")}}, poison)
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	var mu sync.Mutex
	var rejected []publish.Rejection
	f.onRejected = func(r publish.Rejection) error {
		mu.Lock()
		rejected = append(rejected, r)
		mu.Unlock()
		return nil
	}
	e := f.newEngine(t, f.cfg, logmode.Hooks{})
	run(t, e)
	big := make([]byte, 16384)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = 'a' + byte(rng.IntN(26))
	}
	want := []event{{id: "ok-1", dest: f.orders(), key: "k"}, {id: "ok-2", dest: f.orders(), key: "k"}}
	commitEvents(t, f.db.Pool, want[0],
		event{id: "bad", dest: poison, key: "k", payload: append(append([]byte(`"`), big...), '"')}, want[1])
	more := writeEvents(t, f, "after", 2, 3, 2)
	want = append(want, more...)
	testenv.WaitFor(t, time.Minute, "the events around the poison record committed", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(want)
	})
	requireExactlyOnce(t, f, want)
	require.Empty(t, committedRecords(t, f, poison))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, rejected, 1, "one dead letter")
	require.Equal(t, "bad", rejected[0].MessageID)
	require.Equal(t, "message_too_large", rejected[0].Code)
	_, counters := e.ExactlyOnce()
	require.GreaterOrEqual(t, counters.Aborted(), int64(2), "aborted as a suspect, then as refused")
}

// Run's end commits the open Kafka transaction when it holds whole PostgreSQL transactions,
// then confirms it to the slot: the next engine neither skips nor republishes anything.
func TestExactlyOnceShutdownCommitsAndConfirms(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 1)
	var pg, acks testenv.Progress
	var reports testenv.Progress
	e := f.newEngine(t, f.cfg, logmode.Hooks{
		HoldCommits: true, // the stream never commits: only Run's end does
		OnCommit:    func(pglogrepl.LSN) { pg.Add(1) },
		OnAck:       func(string) { acks.Add(1) },
		OnReport:    func(pos pglogrepl.LSN) { reports.Set(max(reports.Value(), int64(pos))) },
	})
	stop := run(t, e)
	want := writeEvents(t, f, "e", 3, 4, 2)
	pg.Wait(t, 3, time.Minute, nil)
	acks.Wait(t, int64(len(want)), time.Minute, nil)
	// (A read_committed reader would wait for the open transaction's end here.)
	_, counters := e.ExactlyOnce()
	require.Zero(t, counters.Committed(), "nothing committed before the end")
	stop()
	requireExactlyOnce(t, f, want)
	txnID, _ := e.ExactlyOnce()
	require.Equal(t, int64(1), counters.Committed())
	p := f.readPosition(t, txnID)
	require.Equal(t, int64(p.LSN), reports.Value(), "the last report confirmed what Kafka committed")
	confirmed, err := pglogrepl.ParseLSN(slotConfirmed(t, f))
	require.NoError(t, err)
	require.Equal(t, p.LSN, uint64(confirmed))
}

// A position in Kafka past the server's WAL end (the database was restored to an earlier
// point, its system identifier unchanged) stops the engine with what to do: skipping to it
// would skip the new transactions.
func TestExactlyOnceRefusesAPositionPastTheWAL(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 1)
	ctx := context.Background()
	var sysID, dbName string
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT system_identifier::text, current_database() FROM pg_control_system()`).Scan(&sysID, &dbName))
	txnID := exactlyonce.LogTransactionalID(sysID, dbName, f.db.Schema+"_keiro_log")
	topic := f.cfg.ExactlyOnce.OffsetsTopic
	require.NoError(t, exactlyonce.EnsureTopic(ctx, f.kafka.Client, topic))
	future := walLSN(t, f) + 1<<40
	require.NoError(t, f.kafka.Client.ProduceSync(ctx, exactlyonce.PositionRecord(topic, txnID,
		exactlyonce.Position{LSN: uint64(future), Slot: "s"})).FirstErr())

	e := f.newEngine(t, f.cfg, logmode.Hooks{})
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := e.Run(rctx)
	require.ErrorContains(t, err, "past the server's WAL end")
	require.ErrorContains(t, err, "delete the position")
}

// Small bounds: PostgreSQL transactions larger than the window and than a Kafka transaction's
// MaxRecords go whole into one Kafka transaction (which ends only between two of them), and
// the window's bound commits between them.
func TestExactlyOnceSmallBounds(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 3)
	cfg := f.cfg
	cfg.MaxInFlightRecords = 8
	cfg.ExactlyOnce = &exactlyonce.Config{MaxRecords: 16, Linger: time.Hour}
	var commits testenv.Progress
	e := f.newEngine(t, cfg, logmode.Hooks{OnKafkaCommit: func(pglogrepl.LSN) { commits.Add(1) }})
	run(t, e)
	want := writeEvents(t, f, "big", 5, 40, 6)
	want = append(want, writeEvents(t, f, "small", 30, 1, 6)...)
	testenv.WaitFor(t, time.Minute, "every event committed", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(want)
	})
	requireExactlyOnce(t, f, want)
	require.Zero(t, e.Stats().Rejected)
}

// holdFirstCommit makes the fixture's (kfake) broker hold the first EndTxn that commits until
// release is closed, answering it then with code (0: as the broker would). held is closed
// when it arrives.
func holdFirstCommit(f *fixture, code int16) (held, release chan struct{}) {
	held, release = make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	first.Store(true)
	c := f.kafka.Cluster
	c.ControlKey(int16(kmsg.EndTxn), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.EndTxnRequest)
		if !req.Commit || !first.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		close(held)
		c.SleepControl(func() { <-release })
		if code == 0 {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.EndTxnResponse)
		resp.Version, resp.ErrorCode = req.Version, code
		return resp, nil, true
	})
	return held, release
}

// While a Kafka transaction commits, the stream goes on: the next transaction's records are
// read and produced (by the other producer) before the commit completes, and commit after it.
func TestExactlyOnceProducesWhileACommitIsUnderWay(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 1)
	held, release := holdFirstCommit(f, 0)
	var acked atomic.Int64
	var order []pglogrepl.LSN
	var mu sync.Mutex
	e := f.newEngine(t, f.cfg, logmode.Hooks{
		OnAck: func(string) { acked.Add(1) },
		OnKafkaCommit: func(pos pglogrepl.LSN) {
			mu.Lock()
			order = append(order, pos)
			mu.Unlock()
		},
	})
	run(t, e)
	first := writeEvents(t, f, "first", 1, 5, 2)
	<-held
	second := writeEvents(t, f, "second", 2, 5, 2)
	testenv.WaitFor(t, time.Minute, "the next transaction's records are acknowledged while the first commits", func() bool {
		return acked.Load() == int64(len(first)+len(second))
	})
	mu.Lock()
	require.Empty(t, order, "no Kafka transaction has committed yet")
	mu.Unlock()
	close(release)
	testenv.WaitFor(t, time.Minute, "every event committed", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(first)+len(second)
	})
	requireExactlyOnce(t, f, append(first, second...))
	mu.Lock()
	defer mu.Unlock()
	require.True(t, slices.IsSorted(order), "the commits complete in order: %v", order)
	_, counters := e.ExactlyOnce()
	require.Zero(t, counters.Aborted())
}

// A commit that fails stops the transaction after it from committing, although its records are
// all acknowledged: it is aborted, the session ends, and the next replays both from Kafka's
// position. A read_committed reader sees each event once, in order.
func TestExactlyOnceNothingCommitsAfterAFailedCommit(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 1)
	held, release := holdFirstCommit(f, kerr.InvalidTxnState.Code)
	var acked atomic.Int64
	e := f.newEngine(t, f.cfg, logmode.Hooks{OnAck: func(string) { acked.Add(1) }})
	run(t, e)
	first := writeEvents(t, f, "first", 1, 5, 2)
	<-held
	second := writeEvents(t, f, "second", 2, 5, 2)
	testenv.WaitFor(t, time.Minute, "the next transaction's records are acknowledged while the first commits", func() bool {
		return acked.Load() == int64(len(first)+len(second))
	})
	close(release) // the first commit fails
	testenv.WaitFor(t, time.Minute, "every event committed by the next session", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(first)+len(second)
	})
	requireExactlyOnce(t, f, append(first, second...))
	_, counters := e.ExactlyOnce()
	require.GreaterOrEqual(t, counters.Aborted(), int64(2), "the failed transaction and the one after it were aborted")
	require.GreaterOrEqual(t, e.Sessions(), int64(2), "a session replayed them")
}

// holdFirstProducer makes the fixture's (kfake) broker hold every produce of the engine's first
// transactional producer (its id has no LogPipelineID suffix) until release is closed. held is
// closed when the first arrives.
func holdFirstProducer(f *fixture) (held, release chan struct{}) {
	held, release = make(chan struct{}), make(chan struct{})
	var first sync.Once
	c := f.kafka.Cluster
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		if req.TransactionID == nil || strings.HasSuffix(*req.TransactionID, exactlyonce.LogPipelineID("")) {
			return nil, nil, false
		}
		first.Do(func() { close(held) })
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	return held, release
}

// A Kafka transaction's commit waits for its records off the stream: while they are on their
// way (their produce held by the broker), the stream reads and decodes the next PostgreSQL
// transaction for the other producer, whose records the engine holds until the first
// transaction's have settled (each key keeps its order on its partition). Both commit, in order,
// and a read_committed reader sees each event once.
func TestExactlyOnceReadsOnWhileACommitWaitsForItsRecords(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 1)
	held, release := holdFirstProducer(f)
	var mu sync.Mutex
	var started, read, committed []pglogrepl.LSN
	var acked []string
	e := f.newEngine(t, f.cfg, logmode.Hooks{
		OnCommitStarted: func(pos pglogrepl.LSN) { mu.Lock(); started = append(started, pos); mu.Unlock() },
		OnCommit:        func(end pglogrepl.LSN) { mu.Lock(); read = append(read, end); mu.Unlock() },
		OnAck:           func(id string) { mu.Lock(); acked = append(acked, id); mu.Unlock() },
		OnKafkaCommit:   func(pos pglogrepl.LSN) { mu.Lock(); committed = append(committed, pos); mu.Unlock() },
	})
	run(t, e)
	first := writeEvents(t, f, "first", 1, 5, 2)
	<-held
	testenv.WaitFor(t, time.Minute, "the first transaction is handed to its commit", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(started) == 1
	})
	second := writeEvents(t, f, "second", 1, 5, 2)
	testenv.WaitFor(t, time.Minute, "the next transaction is read while the first's records are held", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(read) > 0 && read[len(read)-1] > started[0]
	})
	mu.Lock()
	require.Empty(t, acked, "no record is acknowledged: the next transaction's wait for the first's to settle")
	require.Empty(t, committed, "no Kafka transaction has committed yet")
	mu.Unlock()
	close(release)
	testenv.WaitFor(t, time.Minute, "every event committed", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(first)+len(second)
	})
	requireExactlyOnce(t, f, append(first, second...))
	mu.Lock()
	defer mu.Unlock()
	var want []string
	for _, ev := range append(first, second...) {
		want = append(want, ev.id)
	}
	require.Equal(t, want, acked, "the first transaction's records are acknowledged before the next's")
	require.True(t, slices.IsSorted(committed), "the commits complete in order: %v", committed)
	_, counters := e.ExactlyOnce()
	require.Zero(t, counters.Aborted())
}
