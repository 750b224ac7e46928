package logmode_test

import (
	"context"
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
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/logmode"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// A transaction that begins first and commits last is published after every transaction
// that committed before it: the stream is in commit order, not in insert order.
func TestCommitOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}})
	ctx := context.Background()
	acks := &testenv.Progress{}
	e := f.newEngine(t, f.cfg, logmode.Hooks{OnAck: func(string) { acks.Add(1) }})
	run(t, e)

	// late opens first and holds its transaction while others of the same keys commit.
	late, err := f.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, enqueue(ctx, late, event{id: "late-a", dest: "orders", key: "a"}, event{id: "late-b", dest: "orders", key: "b"}))
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				commitEvents(t, f.db.Pool, event{id: fmt.Sprintf("w%d-%d-a", w, i), dest: "orders", key: "a"},
					event{id: fmt.Sprintf("w%d-%d-b", w, i), dest: "orders", key: "b"})
			}
		}()
	}
	wg.Wait()
	require.NoError(t, late.Commit(ctx))
	commitEvents(t, f.db.Pool, event{id: "after-a", dest: "orders", key: "a"})

	acks.Wait(t, 43, time.Minute, nil)
	got := ids(f.kafka.Records(t, "orders"))
	require.Len(t, got, 43)
	require.Equal(t, []string{"late-a", "late-b", "after-a"}, got[40:], "late commits after the 40 others")
	// Each writer's transactions, committed one after another, keep their order.
	for w := range 4 {
		var mine []string
		for _, id := range got[:40] {
			if strings.HasPrefix(id, fmt.Sprintf("w%d-", w)) {
				mine = append(mine, id)
			}
		}
		var want []string
		for i := range 5 {
			want = append(want, fmt.Sprintf("w%d-%d-a", w, i), fmt.Sprintf("w%d-%d-b", w, i))
		}
		require.Equal(t, want, mine)
	}
}

// The records carry the envelope as the claim relay encodes it: the inbox decodes them.
func TestRecordsDecode(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}})
	acks := &testenv.Progress{}
	run(t, f.newEngine(t, f.cfg, logmode.Hooks{OnAck: func(string) { acks.Add(1) }}))
	commitEvents(t, f.db.Pool, event{id: "m-1", dest: "orders", key: "k", payload: []byte(`{"total":12}`)},
		event{id: "m-2", dest: "orders"})
	acks.Wait(t, 2, time.Minute, nil)
	recs := f.kafka.Records(t, "orders")
	require.Len(t, recs, 2)
	hdrs := make([]envelope.Header, len(recs[0].Headers))
	for i, h := range recs[0].Headers {
		hdrs[i] = envelope.Header{Key: h.Key, Value: h.Value}
	}
	ev, err := envelope.Decode(envelope.Record{Topic: recs[0].Topic, Key: recs[0].Key, Value: recs[0].Value, Headers: hdrs})
	require.NoError(t, err)
	require.Equal(t, "m-1", ev.MessageID)
	require.Equal(t, "ordering", ev.Source)
	require.Equal(t, "k", *ev.Key)
	require.Equal(t, `{"total":12}`, string(ev.Payload))
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", ev.TraceContext.Traceparent)
	require.Nil(t, recs[1].Key, "a null key stays null")
}

// An engine stopped mid-drain, with records in flight, confirmed only what Kafka had
// acknowledged: the next one publishes every event at least once, none skipped.
func TestKillMidDrainReplays(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}})
	const txns, per = 40, 50
	for i := range txns {
		evs := make([]event, per)
		for j := range evs {
			evs[j] = event{id: fmt.Sprintf("e-%d-%d", i, j), dest: "orders", key: fmt.Sprintf("k%d", j%7)}
		}
		commitEvents(t, f.db.Pool, evs...)
	}
	// The broker holds every produce request after the first few: the first engine has
	// records in flight, behind keepalives that report a WAL end past all of them.
	var held sync.Once
	heldCh := make(chan struct{})
	release := make(chan struct{})
	produces := 0
	var mu sync.Mutex
	f.kafka.Cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		mu.Lock()
		produces++
		n := produces
		mu.Unlock()
		if n > 3 {
			held.Do(func() { close(heldCh) })
			f.kafka.Cluster.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	cfg := f.cfg
	cfg.ShutdownTimeout = time.Millisecond // a kill: nothing waits for the records in flight
	cfg.MaxInFlightRecords = 300
	first := f.newEngine(t, cfg, logmode.Hooks{})
	stop := run(t, first)
	<-heldCh
	stop()
	confirmed := slotConfirmed(t, f)
	close(release)

	seen := map[string]bool{}
	var mu2 sync.Mutex
	acks := &testenv.Progress{}
	second := f.newEngine(t, f.cfg, logmode.Hooks{OnAck: func(id string) {
		mu2.Lock()
		if !seen[id] {
			seen[id] = true
			acks.Add(1)
		}
		mu2.Unlock()
	}})
	run(t, second)
	// Every event the first engine did not get confirmed is published again by the second.
	got := map[string]bool{}
	testenv.WaitFor(t, time.Minute, "every event on the topic", func() bool {
		for _, id := range ids(f.kafka.Records(t, "orders")) {
			got[id] = true
		}
		return len(got) == txns*per
	})
	require.Positive(t, acks.Value(), "the second engine replayed from %s", confirmed)
}

// slotConfirmed reads the slot's confirmed position.
func slotConfirmed(t *testing.T, f *fixture) string {
	var lsn *string
	require.NoError(t, f.db.Pool.QueryRow(context.Background(),
		`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, f.db.Schema+"_keiro_log").Scan(&lsn))
	if lsn == nil {
		return ""
	}
	return *lsn
}

// A second engine on the slot waits on standby and takes over when the active one stops.
func TestStandbyTakesOver(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}})
	active := make(chan string, 64)
	standby := make(chan int, 1)
	firstAcks, secondAcks := &testenv.Progress{}, &testenv.Progress{}
	first := f.newEngine(t, f.cfg, logmode.Hooks{OnActive: func() { sendNoWait(active, "first") }, OnAck: func(string) { firstAcks.Add(1) }})
	stopFirst := run(t, first)
	require.Equal(t, "first", <-active)
	second := f.newEngine(t, f.cfg, logmode.Hooks{
		OnActive: func() { sendNoWait(active, "second") },
		OnStandby: func(pid int) {
			select {
			case standby <- pid:
			default:
			}
		},
		OnAck: func(string) { secondAcks.Add(1) },
	})
	run(t, second)
	require.Positive(t, <-standby, "the second engine saw the first one's pid on the slot")
	commitEvents(t, f.db.Pool, event{id: "before", dest: "orders", key: "k"})
	firstAcks.Wait(t, 1, time.Minute, nil)
	require.Zero(t, secondAcks.Value(), "the standby publishes nothing")

	stopFirst()
	require.Equal(t, "second", <-active)
	commitEvents(t, f.db.Pool, event{id: "after", dest: "orders", key: "k"})
	secondAcks.Wait(t, 1, time.Minute, nil)
	got := ids(f.kafka.Records(t, "orders"))
	require.Equal(t, "after", got[len(got)-1])
	require.Contains(t, got, "before")
}

// A record Kafka refuses for good is reported with its event's ids, and the stream goes on:
// the events after it are published and the slot confirms past it.
func TestPoisonRecordDoesNotStopTheStream(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders", "poison"}})
	ctx := context.Background()
	res, err := kadm.NewClient(f.kafka.Client).AlterTopicConfigs(ctx,
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr("2048")}}, "poison")
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	rejected := make(chan publish.Rejection, 4)
	last := make(chan struct{})
	var lastOnce sync.Once
	cfg := f.cfg
	f.onRejected = func(r publish.Rejection) error { rejected <- r; return nil }
	run(t, f.newEngine(t, cfg, logmode.Hooks{OnAck: func(id string) {
		if id == "ok-4" {
			lastOnce.Do(func() { close(last) })
		}
	}}))
	// Incompressible text: the producer compresses, and a run of zeros would fit the limit.
	big := make([]byte, 16384)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = 'a' + byte(rng.IntN(26))
	}
	commitEvents(t, f.db.Pool, event{id: "ok-1", dest: "orders", key: "k"},
		event{id: "bad", dest: "poison", key: "k", payload: append(append([]byte(`"`), big...), '"')},
		event{id: "ok-2", dest: "orders", key: "k"})
	commitEvents(t, f.db.Pool, event{id: "ok-3", dest: "orders", key: "k"})
	r := <-rejected
	require.Equal(t, "bad", r.MessageID)
	require.Equal(t, "ordering", r.Source)
	require.Equal(t, "poison", r.Destination)
	require.Equal(t, "message_too_large", r.Code)
	// An event committed after the rejection is published after every other: the stream
	// moved on past the poison record.
	commitEvents(t, f.db.Pool, event{id: "ok-4", dest: "orders", key: "k"})
	<-last
	got := ids(f.kafka.Records(t, "orders"))
	require.Subset(t, got, []string{"ok-1", "ok-2", "ok-3"})
	require.Equal(t, "ok-4", got[len(got)-1])
	require.Empty(t, rejected, "one rejection")
}

// Bad configuration and a client built without the relay's producer options are refused,
// every problem at once.
func TestNewRejectsBadInput(t *testing.T) {
	t.Parallel()
	_, err := logmode.New("postgres://x@127.0.0.1/db", nil, logsource.Config{Slot: "Bad-Name", MaxInFlightRecords: -1})
	require.Error(t, err)
	for _, want := range []string{"publisher is nil", `Slot "Bad-Name"`, "MaxInFlightRecords must not be negative"} {
		require.ErrorContains(t, err, want)
	}
	k := testenv.NewKafka(t)
	_, err = publish.New(publish.Config{Client: k.NewClient(t)})
	require.ErrorContains(t, err, "ManualFlushing is required")
}

// holdProduces makes the broker hold every produce request while hold is set, until release
// is closed; held is closed when the first request is held.
type producesHold struct {
	on      atomic.Bool
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func holdProduces(f *fixture) *producesHold {
	h := &producesHold{held: make(chan struct{}), release: make(chan struct{})}
	f.kafka.Cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if h.on.Load() {
			h.once.Do(func() { close(h.held) })
			f.kafka.Cluster.SleepControl(func() { <-h.release })
		}
		return nil, nil, false
	})
	return h
}

// walLSN reads the server's current WAL position.
func walLSN(t *testing.T, f *fixture) pglogrepl.LSN {
	t.Helper()
	var s string
	require.NoError(t, f.db.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s))
	lsn, err := pglogrepl.ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

// While a transaction's records wait for Kafka, keepalives report a WAL end past it (the
// server pings a reader whose confirmed position is behind what it sent, and other tables'
// writes move the WAL on), and the engine goes on confirming only what Kafka acknowledged: no
// status update and no slot position reaches the transaction's end until its records are
// acked.
func TestConfirmWaitsForAcksWhileKeepalivesArrive(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}})
	ctx := context.Background()
	hold := holdProduces(f)
	var heldEnd atomic.Uint64 // the held transaction's end, once its Commit was read
	var mu sync.Mutex
	var passed []pglogrepl.LSN
	commits := make(chan pglogrepl.LSN, 8)
	keepalives := make(chan pglogrepl.LSN, 64)
	reports := make(chan pglogrepl.LSN, 64)
	acks := &testenv.Progress{}
	e := f.newEngine(t, f.cfg, logmode.Hooks{
		OnAck:    func(string) { acks.Add(1) },
		OnCommit: func(end pglogrepl.LSN) { commits <- end },
		OnKeepalive: func(walEnd pglogrepl.LSN) {
			select {
			case keepalives <- walEnd:
			default:
			}
		},
		OnReport: func(pos pglogrepl.LSN) {
			if end := heldEnd.Load(); hold.on.Load() && end != 0 && uint64(pos) >= end {
				mu.Lock()
				passed = append(passed, pos)
				mu.Unlock()
			}
			select {
			case reports <- pos:
			default:
			}
		},
	})
	run(t, e)
	commitEvents(t, f.db.Pool, event{id: "first", dest: "orders", key: "k"})
	<-commits
	acks.Wait(t, 1, time.Minute, nil)

	hold.on.Store(true)
	commitEvents(t, f.db.Pool, event{id: "held-1", dest: "orders", key: "k"}, event{id: "held-2", dest: "orders", key: "j"})
	end := <-commits
	heldEnd.Store(uint64(end))
	<-hold.held
	// Move the WAL on with writes outside the publication until three keepalives reported a
	// WAL end past the held transaction.
	_, err := f.db.Pool.Exec(ctx, `CREATE TABLE other (n int)`)
	require.NoError(t, err)
	for seen := 0; seen < 3; {
		_, err := f.db.Pool.Exec(ctx, `INSERT INTO other VALUES (1)`)
		require.NoError(t, err)
		select {
		case walEnd := <-keepalives:
			if walEnd > end {
				seen++
			}
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Status updates go out every 200 ms: wait for two more after those keepalives.
	for len(reports) > 0 {
		<-reports
	}
	<-reports
	<-reports
	mu.Lock()
	early := slices.Clone(passed)
	mu.Unlock()
	require.Empty(t, early, "no status update reached the unacknowledged transaction's end %s", end)
	require.Less(t, slotConfirmedLSN(t, f), end, "the slot's confirmed position")
	require.Equal(t, int64(1), acks.Value(), "the held records were not acknowledged")

	hold.on.Store(false)
	close(hold.release)
	acks.Wait(t, 3, time.Minute, nil)
	testenv.WaitFor(t, time.Minute, "the slot confirms the acknowledged transaction", func() bool {
		return slotConfirmedLSN(t, f) >= end
	})
}

// slotConfirmedLSN reads the slot's confirmed position as an LSN.
func slotConfirmedLSN(t *testing.T, f *fixture) pglogrepl.LSN {
	t.Helper()
	s := slotConfirmed(t, f)
	if s == "" {
		return 0
	}
	lsn, err := pglogrepl.ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

// A replication connection that PostgreSQL ends (a terminated backend, a restart, a network
// cut) ends the session; the next one replays from the slot's confirmed position: the
// transaction whose records were in flight is published again, the confirmed one before it
// is not.
func TestConnectionLostReplaysFromConfirmed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}})
	ctx := context.Background()
	hold := holdProduces(f)
	var sessions atomic.Int64
	active := make(chan int64, 64)
	var mu sync.Mutex
	acked := map[string][]int64{} // message id → the sessions that published it
	acks := &testenv.Progress{}
	e := f.newEngine(t, f.cfg, logmode.Hooks{
		OnActive: func() { sendNoWait(active, sessions.Add(1)) },
		OnAck: func(id string) {
			mu.Lock()
			acked[id] = append(acked[id], sessions.Load())
			mu.Unlock()
			acks.Add(1)
		},
	})
	run(t, e)
	require.EqualValues(t, 1, <-active)
	commitEvents(t, f.db.Pool, event{id: "confirmed", dest: "orders", key: "k"})
	afterFirst := walLSN(t, f)
	acks.Wait(t, 1, time.Minute, nil)
	testenv.WaitFor(t, time.Minute, "the first transaction confirmed", func() bool {
		return slotConfirmedLSN(t, f) >= afterFirst
	})

	hold.on.Store(true)
	commitEvents(t, f.db.Pool, event{id: "in-flight-1", dest: "orders", key: "k"}, event{id: "in-flight-2", dest: "orders", key: "j"})
	<-hold.held
	_, err := f.db.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`,
		f.db.Schema+"_keiro_log")
	require.NoError(t, err)
	hold.on.Store(false)
	close(hold.release)
	require.EqualValues(t, 2, <-active, "a new session after the connection was lost")

	testenv.WaitFor(t, time.Minute, "the in-flight transaction published by the second session", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(acked["in-flight-1"], 2) && slices.Contains(acked["in-flight-2"], 2)
	})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int64{1}, acked["confirmed"], "the confirmed transaction is not replayed")
}

// A rejected record stays in flight until the publisher's DeadLetter sink wrote its dead letter: while the sink
// fails, no status update confirms the record's transaction, the session ends and the next
// one replays it (and calls the sink again); once the sink works, the transaction is
// confirmed and the rejection counted once.
func TestDeadLetterFailureHoldsTheTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders", "poison"}})
	ctx := context.Background()
	res, err := kadm.NewClient(f.kafka.Client).AlterTopicConfigs(ctx,
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr("2048")}}, "poison")
	require.NoError(t, err)
	require.NoError(t, res[0].Err)

	var failing, written atomic.Bool
	failing.Store(true)
	var refusals atomic.Int64
	var poisonEnd atomic.Uint64 // the poison transaction's end: the first transaction read
	var violation atomic.Value  // the position a status update confirmed too early
	confirmedPast := make(chan struct{})
	var pastOnce sync.Once
	cfg := f.cfg
	f.onRejected = func(r publish.Rejection) error {
		require.Equal(t, "bad", r.MessageID)
		require.NotNil(t, r.Event)
		require.Equal(t, "poison", r.Event.Destination)
		if failing.Load() {
			refusals.Add(1)
			return fmt.Errorf("database down")
		}
		written.Store(true)
		return nil
	}
	e := f.newEngine(t, cfg, logmode.Hooks{
		OnCommit: func(end pglogrepl.LSN) { poisonEnd.CompareAndSwap(0, uint64(end)) },
		OnReport: func(pos pglogrepl.LSN) {
			end := poisonEnd.Load()
			if end == 0 || uint64(pos) < end {
				return
			}
			if !written.Load() {
				violation.Store(pos)
			} else {
				pastOnce.Do(func() { close(confirmedPast) })
			}
		},
	})
	run(t, e)
	big := make([]byte, 16384)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range big {
		big[i] = 'a' + byte(rng.IntN(26))
	}
	commitEvents(t, f.db.Pool, event{id: "bad", dest: "poison", key: "k", payload: append(append([]byte(`"`), big...), '"')},
		event{id: "ok-1", dest: "orders", key: "k"})
	testenv.WaitFor(t, time.Minute, "a replay called the failing sink again", func() bool { return refusals.Load() >= 2 })
	require.Nil(t, violation.Load(), "a status update confirmed the transaction of an unwritten dead letter")
	require.GreaterOrEqual(t, e.Stats().Sessions, int64(2), "the failed write ended the session")
	require.Zero(t, e.Stats().Rejected)

	failing.Store(false)
	select {
	case <-confirmedPast:
	case <-time.After(time.Minute):
		t.Fatal("the transaction was not confirmed once the dead letter was written")
	}
	require.Nil(t, violation.Load())
	require.EqualValues(t, 1, e.Stats().Rejected)
}
