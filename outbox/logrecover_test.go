package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// A slot lost with events it had not confirmed: the relay starts a new slot, which holds only
// what is written after it, and Admin.RecoverLog copies the lost range of keiro_outbox_log into
// keiro_outbox, which the log-mode relay's claim loop publishes: every event reaches Kafka, the
// recovered ones in each key's order, and a second recovery copies nothing.
func TestLogModeRecoverAfterALostSlot(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 2)
	ctx := context.Background()
	slot := outbox.DefaultLogSlot(db.Schema)
	dropLogSlot(t, db.Pool, slot)
	_, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeLog, "")
	require.NoError(t, err)

	var since time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT now()`).Scan(&since))
	lost := keyedEvents("orders", 30, 5)
	enqueue(t, db.Pool, st, lost...)
	var until time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&until))
	// The slot is lost before any relay read it (as an invalidation or a failover without
	// failover slots would lose it).
	_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	require.NoError(t, err)

	startRelay(t, db, kc, outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine, PollInterval: 50 * time.Millisecond, Logger: testLogger(t)})
	// Read by a walsender: while the relay creates the slot, the creating backend is its active
	// pid, and a transaction that commits before the creation ends is not decoded.
	testenv.WaitFor(t, time.Minute, "the relay created a new slot and reads it", func() bool {
		ss, err := outbox.AdminOf(st).LogSlotStatus(ctx, db.Pool, "")
		if err != nil || !ss.Exists || ss.ActivePID == 0 {
			return false
		}
		var walsender bool
		err = db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE pid = $1 AND backend_type = 'walsender')`, ss.ActivePID).Scan(&walsender)
		return err == nil && walsender
	})
	var later []envelope.Event
	for i := range 10 {
		k := fmt.Sprintf("new%d", i%2)
		later = append(later, event(fmt.Sprintf("n-%02d", i), "orders", &k, fmt.Sprintf(`{"i":%d}`, i)))
	}
	enqueue(t, db.Pool, st, later...)
	distinct, _ := checkOrder(t, kc.ConsumeRecords(t, 10, time.Minute, "orders"))
	require.Equal(t, 10, distinct, "the new slot publishes what is written after it, not the lost range")

	r, err := outbox.AdminOf(st).RecoverLog(ctx, db.Pool, since, until)
	require.NoError(t, err)
	require.Equal(t, outbox.LogRecovery{Found: 30, Copied: 30}, r)
	recs := kc.ConsumeRecords(t, 40, time.Minute, "orders")
	distinct, _ = checkOrder(t, recs)
	require.Equal(t, 40, distinct)
	testenv.WaitFor(t, time.Minute, "the recovered rows are marked sent", func() bool {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_outbox WHERE status = 'sent'`).Scan(&n)
		return err == nil && n == 30
	})
	r, err = outbox.AdminOf(st).RecoverLog(ctx, db.Pool, since, until)
	require.NoError(t, err)
	require.Equal(t, outbox.LogRecovery{Found: 30, Copied: 0}, r, "a second recovery copies nothing")
	_, err = outbox.AdminOf(st).RecoverLog(ctx, db.Pool, until, since)
	require.ErrorContains(t, err, "must be after")
}
