package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// destRig is a schema with topics orders and payments (one partition each, so a topic's
// offsets are the order it was published in) and the slots of the two destination groups,
// prepared before the switch to log mode and dropped when the test ends.
func destRig(t *testing.T) (*testenv.DB, *testenv.Kafka, *outbox.Store, string, string) {
	t.Helper()
	db, kc, st := rig(t, 1)
	kc.CreateTopic(t, "payments", 1)
	ctx := context.Background()
	slotA := outbox.LogSlotFor(db.Schema, []string{"orders"})
	slotB := outbox.LogSlotFor(db.Schema, []string{"payments"})
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	for _, s := range []struct {
		slot  string
		dests []string
	}{{slotA, []string{"orders"}}, {slotB, []string{"payments"}}} {
		dropLogSlot(t, db.Pool, s.slot)
		got, created, err := outbox.AdminOf(st).PrepareLogSlot(ctx, db.Pool, "", s.dests)
		require.NoError(t, err)
		require.Equal(t, s.slot, got)
		require.True(t, created)
	}
	return db, kc, st, slotA, slotB
}

// confirmedPast waits until slot has confirmed the WAL position lsn: every transaction that
// committed before it was handled (its records acknowledged, or none of them were the slot's).
func confirmedPast(t *testing.T, pool *pgxpool.Pool, slot, lsn string) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, "slot "+slot+" confirmed "+lsn, func() bool {
		var ok bool
		err := pool.QueryRow(context.Background(), `SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false)
			FROM pg_replication_slots WHERE slot_name = $1`, slot, lsn).Scan(&ok)
		require.NoError(t, err)
		return ok
	})
}

// walPosition reads the current WAL position.
func walPosition(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var lsn string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn))
	return lsn
}

// recordIDs decodes records' message ids, in their order.
func recordIDs(t *testing.T, recs []*kgo.Record) []string {
	t.Helper()
	ids := make([]string, len(recs))
	for i, r := range recs {
		hs := make([]envelope.Header, len(r.Headers))
		for j, h := range r.Headers {
			hs[j] = envelope.Header{Key: h.Key, Value: h.Value}
		}
		e, err := envelope.Decode(envelope.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp})
		require.NoError(t, err)
		ids[i] = e.MessageID
	}
	return ids
}

// Two relays with disjoint Destinations on one schema in log mode each follow a slot of their
// own, whose publication gives it only their rows: each publishes exactly its topic, in commit
// order, the rows pending in keiro_outbox at the switch first. A relay never receives the other
// topic's rows: with only the orders relay running, its slot confirms past every transaction
// (mixed ones too) while payments stays empty, and a relay of the default slot (every
// destination), or of a set that overlaps, refuses to start, naming the slot it overlaps.
func TestLogModePerDestinationRelays(t *testing.T) {
	t.Parallel()
	db, kc, st, slotA, slotB := destRig(t)
	ctx := context.Background()

	// Overlaps are refused before anything is created: the default slot publishes every
	// destination, and {orders, audit} shares orders with slot A.
	_, _, err := outbox.AdminOf(st).PrepareLogSlot(ctx, db.Pool, "", nil)
	require.ErrorIs(t, err, outbox.ErrLogSlotOverlap)
	require.ErrorContains(t, err, "would publish every destination, and the slot")
	_, _, err = outbox.AdminOf(st).PrepareLogSlot(ctx, db.Pool, "", []string{"audit", "orders"})
	require.ErrorIs(t, err, outbox.ErrLogSlotOverlap)
	require.ErrorContains(t, err, "the slot "+slotA+" of the schema already publishes the destinations orders: both would publish orders")
	// A named slot whose publication has another set is refused too.
	_, _, err = outbox.AdminOf(st).PrepareLogSlot(ctx, db.Pool, slotA, []string{"orders", "audit"})
	require.ErrorContains(t, err, "publication "+slotA+" publishes the destinations orders, and this relay the destinations audit, orders")
	slots, err := outbox.AdminOf(st).LogSlots(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, slots, 2, "nothing was created by the refused ones: %+v", slots)

	// Claim mode: two rows of each topic, pending in keiro_outbox at the switch.
	var orders, payments []string
	write := func(evs ...envelope.Event) {
		enqueue(t, db.Pool, st, evs...)
		for _, ev := range evs {
			if ev.Destination == "orders" {
				orders = append(orders, ev.MessageID)
			} else {
				payments = append(payments, ev.MessageID)
			}
		}
	}
	ev := func(i int, topic string) envelope.Event {
		k := fmt.Sprintf("k%d", i%3)
		return event(fmt.Sprintf("m-%06d", i), topic, &k, fmt.Sprintf(`{"i":%d}`, i))
	}
	write(ev(0, "orders"), ev(1, "payments"))
	write(ev(2, "payments"), ev(3, "orders"))

	// The orders relay alone: it switches the schema, publishes the pending orders rows (not
	// waiting for the payments ones, which are not its own), then follows its slot.
	_, _ = startRelay(t, db, kc, outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine, Destinations: []string{"orders"},
		PollInterval: 50 * time.Millisecond, MaintenanceInterval: time.Hour, Logger: testLogger(t)})
	testenv.WaitFor(t, time.Minute, "the orders relay switched the schema", func() bool {
		m, err := outbox.AdminOf(st).Mode(ctx, db.Pool)
		return err == nil && m == outbox.ModeLog
	})
	for i := 4; i < 40; i += 4 {
		write(ev(i, "orders"))
		write(ev(i+1, "payments"))
		write(ev(i+2, "orders"), ev(i+3, "payments")) // one transaction of both
	}
	require.Equal(t, 36, count(t, db.Pool, "keiro_outbox_log"), "every row after the switch is in keiro_outbox_log")
	lsn := walPosition(t, db.Pool)
	got := kc.ConsumeRecords(t, len(orders), time.Minute, "orders")
	require.Equal(t, orders, recordIDs(t, got), "orders in commit order")
	confirmedPast(t, db.Pool, slotA, lsn)
	require.Empty(t, kc.Records(t, "payments"), "the orders relay published no payments row")

	// The payments relay: the pending payments rows, then its slot's.
	_, _ = startRelay(t, db, kc, outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine, Destinations: []string{"payments"},
		PollInterval: 50 * time.Millisecond, MaintenanceInterval: time.Hour, Logger: testLogger(t)})
	got = kc.ConsumeRecords(t, len(payments), time.Minute, "payments")
	require.Equal(t, payments, recordIDs(t, got), "payments in commit order")
	confirmedPast(t, db.Pool, slotB, lsn)
	confirmedPast(t, db.Pool, slotA, walPosition(t, db.Pool))
	require.Equal(t, orders, recordIDs(t, kc.Records(t, "orders")), "orders once each")
	require.Equal(t, payments, recordIDs(t, kc.Records(t, "payments")), "payments once each")

	// Every slot of the schema, with its destinations (relay status, the console).
	slots, err = outbox.AdminOf(st).LogSlots(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, slots, 2)
	byName := map[string]outbox.SlotStatus{slots[0].Slot: slots[0], slots[1].Slot: slots[1]}
	require.Equal(t, []string{"orders"}, byName[slotA].Destinations)
	require.Equal(t, []string{"payments"}, byName[slotB].Destinations)
	for _, s := range slots {
		require.True(t, s.Exists)
		require.NotZero(t, s.ActivePID, "slot %s is read", s.Slot)
	}

	// A relay of every destination on the same schema refuses to start.
	r, err := outbox.NewRelay(db.Pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{
		Schema: db.Schema, Mode: outbox.ModeLog, LogEngine: logrelay.Engine, Logger: testLogger(t)})
	require.NoError(t, err)
	err = r.Run(ctx)
	require.ErrorIs(t, err, outbox.ErrLogSlotOverlap)
	require.ErrorContains(t, err, "slot "+outbox.DefaultLogSlot(db.Schema)+" would publish every destination")
}

// Retention of keiro_outbox_log waits for the slowest slot of the schema: with the payments
// relay down, old rows stay although the orders slot confirmed past every mark; once the
// payments relay has caught up, they go, but for the rows of a destination no slot publishes.
func TestLogModeRetentionWaitsForSlowestSlot(t *testing.T) {
	t.Parallel()
	db, kc, st, slotA, slotB := destRig(t)
	ctx := context.Background()
	cfg := func(dest string) outbox.RelayConfig {
		return outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine, Destinations: []string{dest}, PollInterval: 50 * time.Millisecond,
			MaintenanceInterval: time.Hour, Retention: 24 * time.Hour, Logger: testLogger(t)}
	}
	relayA, _ := startRelay(t, db, kc, cfg("orders"))
	testenv.WaitFor(t, time.Minute, "the orders relay switched the schema", func() bool {
		m, err := outbox.AdminOf(st).Mode(ctx, db.Pool)
		return err == nil && m == outbox.ModeLog
	})
	enqueue(t, db.Pool, st, keyedEvents("orders", 10, 2)...)
	pay := keyedEvents("payments", 10, 2)
	for i := range pay {
		pay[i].MessageID = fmt.Sprintf("p-%06d", i)
	}
	enqueue(t, db.Pool, st, pay...)
	audit := keyedEvents("audit", 3, 1) // a destination no slot publishes
	for i := range audit {
		audit[i].MessageID = fmt.Sprintf("a-%06d", i)
	}
	enqueue(t, db.Pool, st, audit...)
	kc.ConsumeRecords(t, 10, time.Minute, "orders")
	_, err := db.Pool.Exec(ctx, `UPDATE keiro_outbox_log SET created_at = now() - interval '2 days'`)
	require.NoError(t, err)

	// The orders relay's passes record a mark; the orders slot confirms past it, the payments
	// slot (nobody reads it) stays at its creation.
	maintenancePass(t, relayA)
	var mark string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT max(lsn)::text FROM keiro_outbox_log_marks`).Scan(&mark))
	confirmedPast(t, db.Pool, slotA, mark)
	require.Zero(t, maintenancePass(t, relayA).LogDeleted)
	require.Equal(t, 23, count(t, db.Pool, "keiro_outbox_log"), "the payments slot has not confirmed them")

	// The payments relay catches up: its slot passes the mark, and the old rows go.
	relayB, _ := startRelay(t, db, kc, cfg("payments"))
	kc.ConsumeRecords(t, 10, time.Minute, "payments")
	confirmedPast(t, db.Pool, slotB, mark)
	testenv.WaitFor(t, time.Minute, "retention deleted the rows both slots confirmed", func() bool {
		maintenancePass(t, relayB)
		return count(t, db.Pool, "keiro_outbox_log") == 3
	})
	// The rows of a destination no slot publishes stay: they were published by nobody.
	var kept int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_outbox_log WHERE destination = 'audit'`).Scan(&kept))
	require.Equal(t, 3, kept)
}

// Two overlapping sets prepared at once: at most one slot is left, so no destination is
// published by two slots; the other (or both) is refused with ErrLogSlotOverlap.
func TestLogModeOverlapRace(t *testing.T) {
	t.Parallel()
	db, _, st := rig(t, 1)
	ctx := context.Background()
	sets := [][]string{{"orders", "payments"}, {"payments", "audit"}}
	for _, set := range sets {
		dropLogSlot(t, db.Pool, outbox.LogSlotFor(db.Schema, set))
	}
	errs := make(chan error, len(sets))
	for _, set := range sets {
		go func() {
			_, _, err := outbox.AdminOf(st).PrepareLogSlot(ctx, db.Pool, "", set)
			errs <- err
		}()
	}
	ok := 0
	for range sets {
		if err := <-errs; err == nil {
			ok++
		} else {
			require.ErrorIs(t, err, outbox.ErrLogSlotOverlap)
		}
	}
	slots, err := outbox.AdminOf(st).LogSlots(ctx, db.Pool)
	require.NoError(t, err)
	for _, s := range slots {
		require.True(t, s.Exists, "a refused one left its publication: %+v", slots)
	}
	require.LessOrEqual(t, ok, 1)
	require.Len(t, slots, ok, "the refused ones left no slot: %+v", slots)
}
