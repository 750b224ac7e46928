package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// Log mode's retention deletes the rows of keiro_outbox_log older than Retention once the slot
// has confirmed them (a mark of time and WAL position that the slot's confirmed_flush_lsn
// passed), and never for a slot that does not exist: the table is the copy that recovers a
// lost slot's events. Published events are unaffected.
func TestLogModeRetention(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 2)
	ctx := context.Background()
	slot := outbox.DefaultLogSlot(db.Schema)
	dropLogSlot(t, db.Pool, slot)
	relay, _ := startRelay(t, db, kc, outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine, PollInterval: 50 * time.Millisecond,
		MaintenanceInterval: time.Hour, Retention: 24 * time.Hour, RetentionBatch: 3, Logger: testLogger(t)})
	testenv.WaitFor(t, time.Minute, "the log-mode relay switched the schema", func() bool {
		m, err := outbox.AdminOf(st).Mode(ctx, db.Pool)
		return err == nil && m == outbox.ModeLog
	})
	evs := keyedEvents("orders", 20, 4)
	enqueue(t, db.Pool, st, evs...)
	distinct, _ := checkOrder(t, kc.ConsumeRecords(t, 20, time.Minute, "orders"))
	require.Equal(t, 20, distinct)

	// Ten rows written two days ago (an UPDATE is not published: the publication has inserts only).
	_, err := db.Pool.Exec(ctx, `UPDATE keiro_outbox_log SET created_at = now() - interval '2 days'
		WHERE message_id <= $1`, evs[9].MessageID)
	require.NoError(t, err)

	// A relay of a slot that does not exist deletes nothing, however old the rows and marks.
	other, err := outbox.NewRelay(db.Pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{
		Schema: db.Schema, Mode: outbox.ModeLog, LogEngine: logrelay.Engine, LogSlot: slot + "_none", Retention: 24 * time.Hour})
	require.NoError(t, err)
	require.Zero(t, maintenancePass(t, other).LogDeleted)
	_, err = db.Pool.Exec(ctx, `UPDATE keiro_outbox_log_marks SET at = at - interval '3 days'`)
	require.NoError(t, err)
	require.Zero(t, maintenancePass(t, other).LogDeleted)
	require.Equal(t, 20, count(t, db.Pool, "keiro_outbox_log"))

	// The slot's relay: once the slot confirmed past a mark, the ten old rows go (in batches of
	// three), the recent ones stay.
	var deleted int64
	testenv.WaitFor(t, time.Minute, "retention deleted the confirmed old rows", func() bool {
		res, err := relay.MaintenancePass(ctx)
		require.NoError(t, err)
		deleted += res.LogDeleted
		return deleted == 10
	})
	var left []string
	rows, err := db.Pool.Query(ctx, `SELECT message_id FROM keiro_outbox_log ORDER BY message_id`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		left = append(left, id)
	}
	require.NoError(t, rows.Err())
	want := make([]string, 0, 10)
	for _, ev := range evs[10:] {
		want = append(want, ev.MessageID)
	}
	require.Equal(t, want, left)
	// The marks the slot has passed are forgotten, but for the newest one.
	require.LessOrEqual(t, count(t, db.Pool, "keiro_outbox_log_marks"), 2)
}
