package logmode_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/internal/logmode"
	"github.com/keiro-go/keiro/outbox/internal/logmsg"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// emitFixture is a fixture whose schema is in log mode, with a Store to emit through.
func emitFixture(t *testing.T, topics ...string) (*fixture, *outbox.Store) {
	t.Helper()
	f := newFixture(t, testenv.KafkaConfig{Topics: topics})
	_, err := f.db.Pool.Exec(context.Background(), `UPDATE keiro_outbox_settings SET mode = 'log'`)
	require.NoError(t, err)
	st, err := outbox.NewStore(f.db.Schema)
	require.NoError(t, err)
	return f, st
}

// emitted is an event for EmitTx.
func emitted(id, dest, key string) envelope.Event {
	return envelope.Event{MessageID: id, Source: "ordering", Destination: dest, Key: &key, EventType: "OrderPlaced",
		SchemaVersion: 1, ContentType: envelope.ContentTypeJSON, Payload: []byte(`{"id":"` + id + `"}`),
		OccurredAt: time.Now().UTC()}
}

// rawEmit writes a transactional logical message of prefix and content, as any SQL client may.
func rawEmit(ctx context.Context, tx pgx.Tx, prefix string, content []byte) error {
	_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, $2::bytea)`, prefix, content)
	return err
}

// Events written by EmitTx are published in commit order with the rows of keiro_outbox_log, per
// key and across transactions: a transaction that mixes both, one that opened first and
// committed last, and emitted events alone. The records carry the same envelope as a row's.
func TestEmittedEventsInCommitOrderWithRows(t *testing.T) {
	t.Parallel()
	f, st := emitFixture(t, "orders")
	ctx := context.Background()
	acks := &testenv.Progress{}
	run(t, f.newEngine(t, f.cfg, logmode.Hooks{OnAck: func(string) { acks.Add(1) }}))

	late, err := f.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, st.EmitTx(ctx, late, emitted("late-e", "orders", "a")))
	require.NoError(t, enqueue(ctx, late, event{id: "late-r", dest: "orders", key: "a"}))
	var want []string
	for i := range 5 {
		err := pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
			if err := enqueue(ctx, tx, event{id: fmt.Sprintf("r%d", i), dest: "orders", key: "a"}); err != nil {
				return err
			}
			return st.EmitTx(ctx, tx, emitted(fmt.Sprintf("e%d-1", i), "orders", "a"), emitted(fmt.Sprintf("e%d-2", i), "orders", "a"))
		})
		require.NoError(t, err)
		want = append(want, fmt.Sprintf("r%d", i), fmt.Sprintf("e%d-1", i), fmt.Sprintf("e%d-2", i))
		require.NoError(t, pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
			return st.EmitTx(ctx, tx, emitted(fmt.Sprintf("solo%d", i), "orders", "a"))
		}))
		want = append(want, fmt.Sprintf("solo%d", i))
	}
	require.NoError(t, late.Commit(ctx))
	want = append(want, "late-e", "late-r")

	acks.Wait(t, int64(len(want)), time.Minute, nil)
	recs := f.kafka.Records(t, "orders")
	require.Equal(t, want, ids(recs), "one key, commit order, rows and messages interleaved as written")
	hdrs := make([]envelope.Header, len(recs[1].Headers))
	for i, h := range recs[1].Headers {
		hdrs[i] = envelope.Header{Key: h.Key, Value: h.Value}
	}
	ev, err := envelope.Decode(envelope.Record{Topic: recs[1].Topic, Key: recs[1].Key, Value: recs[1].Value, Headers: hdrs})
	require.NoError(t, err)
	require.Equal(t, "e0-1", ev.MessageID)
	require.Equal(t, "a", *ev.Key)
	require.Equal(t, `{"id":"e0-1"}`, string(ev.Payload))
	require.Equal(t, "OrderPlaced", ev.EventType)
}

// An engine stopped mid-drain with emitted events in flight confirmed only what Kafka had
// acknowledged: the next one publishes every emitted event at least once, none lost.
func TestKillMidDrainReplaysEmittedEvents(t *testing.T) {
	t.Parallel()
	f, st := emitFixture(t, "orders")
	ctx := context.Background()
	const txns, per = 30, 40
	for i := range txns {
		evs := make([]envelope.Event, per)
		for j := range evs {
			evs[j] = emitted(fmt.Sprintf("e-%d-%d", i, j), "orders", fmt.Sprintf("k%d", j%7))
		}
		require.NoError(t, pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error { return st.EmitTx(ctx, tx, evs...) }))
	}
	var held sync.Once
	heldCh, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	produces := 0
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
	stop := run(t, f.newEngine(t, cfg, logmode.Hooks{}))
	<-heldCh
	stop()
	confirmed := slotConfirmed(t, f)
	close(release)

	acks := &testenv.Progress{}
	run(t, f.newEngine(t, f.cfg, logmode.Hooks{OnAck: func(string) { acks.Add(1) }}))
	got := map[string]bool{}
	testenv.WaitFor(t, time.Minute, "every emitted event on the topic", func() bool {
		for _, id := range ids(f.kafka.Records(t, "orders")) {
			got[id] = true
		}
		return len(got) == txns*per
	})
	require.Positive(t, acks.Value(), "the second engine replayed from %s", confirmed)
}

// Messages of the schema's prefix whose content does not decode (an unknown format version, a
// truncated content, values that make no event) are dead-lettered with a reason and the stream
// moves on: the good events around them are published in order, and a later one too. Messages
// of another schema's prefix, and a non-transactional message of the prefix, are not events of
// this relay; an engine of some destinations skips the emitted events of the others.
func TestBadMessagesAreDeadLetteredAndOthersIgnored(t *testing.T) {
	t.Parallel()
	f, st := emitFixture(t, "orders", "payments")
	ctx := context.Background()
	var mu sync.Mutex
	var rejected []publish.Rejection
	f.onRejected = func(r publish.Rejection) error {
		mu.Lock()
		rejected = append(rejected, r)
		mu.Unlock()
		return nil
	}
	last := make(chan struct{})
	var once sync.Once
	cfg := f.cfg
	cfg.Destinations = []string{"orders"}
	cfg.Slot = f.db.Schema + "_keiro_log_orders"
	t.Cleanup(func() { dropSlot(t, f.db.Pool, cfg.Slot) })
	active := make(chan struct{}, 1)
	run(t, f.newEngine(t, cfg, logmode.Hooks{
		OnAck: func(id string) {
			if id == "ok-last" {
				once.Do(func() { close(last) })
			}
		},
		OnActive: func() { sendNoWait(active, struct{}{}) },
	}))
	// The engine creates its slot: a slot decodes only what commits after its creation ended.
	select {
	case <-active:
	case <-time.After(time.Minute):
		t.Fatal("the engine did not start replicating")
	}

	prefix := logmsg.Prefix(f.db.Schema)
	good := emitted("ok-2", "orders", "k")
	content := logmsg.Append(nil, &good, nil)
	nullID := append([]byte{logmsg.Version, 0, byte(len(logmsg.Columns)), 'n'}, content[3+5+len(good.MessageID):]...)
	require.NoError(t, pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
		if err := st.EmitTx(ctx, tx, emitted("ok-1", "orders", "k")); err != nil {
			return err
		}
		for _, c := range [][]byte{append([]byte{7}, content[1:]...), content[:len(content)-5], {}, nullID} {
			if err := rawEmit(ctx, tx, prefix, c); err != nil {
				return err
			}
		}
		// Another schema's event, a non-transactional message of the prefix, another
		// destination's event.
		other := emitted("other-schema", "orders", "k")
		if err := rawEmit(ctx, tx, logmsg.Prefix(f.db.Schema+"x"), logmsg.Append(nil, &other, nil)); err != nil {
			return err
		}
		nt := emitted("non-transactional", "orders", "k")
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(false, $1, $2::bytea)`, prefix, logmsg.Append(nil, &nt, nil)); err != nil {
			return err
		}
		if err := st.EmitTx(ctx, tx, emitted("payment", "payments", "k")); err != nil {
			return err
		}
		return rawEmit(ctx, tx, prefix, content)
	}))
	require.NoError(t, pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
		return st.EmitTx(ctx, tx, emitted("ok-last", "orders", "k"))
	}))
	select {
	case <-last:
	case <-time.After(time.Minute):
		t.Fatalf("ok-last not acknowledged; published: %v", ids(f.kafka.Records(t, "orders")))
	}
	require.Equal(t, []string{"ok-1", "ok-2", "ok-last"}, ids(f.kafka.Records(t, "orders")))
	require.Empty(t, f.kafka.Records(t, "payments"), "another slot's destination")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, rejected, 4)
	reasons := map[string]int{}
	for _, r := range rejected {
		require.Equal(t, "undecodable_message", r.Code)
		require.NotNil(t, r.Event)
		switch {
		case strings.HasPrefix(r.MessageID, "logical-message/"):
			require.Equal(t, prefix, r.Source, "the prefix names where it came from")
			require.Equal(t, "application/octet-stream", r.Event.ContentType)
		default:
			require.Equal(t, "", r.MessageID, "the tuple decoded but for its message id")
			require.Equal(t, "ordering", r.Source)
		}
		for _, reason := range []string{"unknown format version 7", "format 1: column 21", "no format version", "column message_id is null"} {
			if strings.Contains(r.Err.Error(), reason) {
				reasons[reason]++
			}
		}
	}
	require.Equal(t, map[string]int{"unknown format version 7": 1, "format 1: column 21": 1, "no format version": 1,
		"column message_id is null": 1}, reasons)
}

// Under exactly once, emitted events go into the Kafka transactions with the rows of their
// PostgreSQL transactions: a read_committed reader sees each once, each key's in commit order.
func TestExactlyOnceEmittedEvents(t *testing.T) {
	t.Parallel()
	f := eoFixture(t, 2)
	ctx := context.Background()
	_, err := f.db.Pool.Exec(ctx, `UPDATE keiro_outbox_settings SET mode = 'log'`)
	require.NoError(t, err)
	st, err := outbox.NewStore(f.db.Schema)
	require.NoError(t, err)
	run(t, f.newEngine(t, f.cfg, logmode.Hooks{}))
	var want []event
	for i := range 12 {
		k := fmt.Sprintf("k%d", i%3)
		row := event{id: fmt.Sprintf("r-%02d", i), dest: f.orders(), key: k}
		ev := emitted(fmt.Sprintf("e-%02d", i), f.orders(), k)
		require.NoError(t, pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
			if i%2 == 0 {
				if err := st.EmitTx(ctx, tx, ev); err != nil {
					return err
				}
				return enqueue(ctx, tx, row)
			}
			if err := enqueue(ctx, tx, row); err != nil {
				return err
			}
			return st.EmitTx(ctx, tx, ev)
		}))
		if i%2 == 0 {
			want = append(want, event{id: ev.MessageID, key: k}, row)
		} else {
			want = append(want, row, event{id: ev.MessageID, key: k})
		}
	}
	testenv.WaitFor(t, time.Minute, "every transaction committed to Kafka", func() bool {
		return len(committedRecords(t, f, f.orders())) >= len(want)
	})
	requireExactlyOnce(t, f, want)
}
