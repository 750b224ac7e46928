package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// TestLogModeRecoversTheSwitchGap: two destination groups' relays start together in claim
// mode; the orders relay switches the schema after the payments relay read the mode and
// before the payments slot exists (forced here from the hook), and payments events are
// written in that gap, in keiro_outbox_log, where no slot has them. The payments relay copies
// them into keiro_outbox and publishes them before it follows its slot: every payments event
// is published, once, in the order written.
func TestLogModeRecoversTheSwitchGap(t *testing.T) {
	t.Parallel()
	db, st := setup(t)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "orders", 1)
	kc.CreateTopic(t, "payments", 1)
	ctx := context.Background()
	for _, dests := range [][]string{{"orders"}, {"payments"}} {
		slot := LogSlotFor(db.Schema, dests)
		t.Cleanup(func() {
			for range 100 {
				_, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
					WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
				if err == nil {
					_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
				}
				if err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond) // a terminated reader releases its slot shortly after
			}
			_, _ = db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+slot)
		})
	}
	write := func(from, to int) []string {
		var ids []string
		for i := from; i < to; i++ {
			key := fmt.Sprintf("k%d", i%2)
			e := envelope.Event{MessageID: fmt.Sprintf("p-%03d", i), Source: "billing", Destination: "payments",
				Key: &key, EventType: "PaymentTaken", SchemaVersion: 1, ContentType: "application/json",
				Payload: []byte(fmt.Sprintf(`{"i":%d}`, i)), OccurredAt: time.Now()}
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := st.EnqueueTx(ctx, tx, e)
				return err
			}))
			ids = append(ids, e.MessageID)
		}
		return ids
	}
	r, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), RelayConfig{Schema: db.Schema, Mode: ModeLog, LogEngine: logrelay.Engine,
		Destinations: []string{"payments"}, PollInterval: 50 * time.Millisecond, MaintenanceInterval: time.Hour,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var want []string
	var once sync.Once
	r.afterModeRead = func() {
		once.Do(func() {
			ch, err := AdminOf(st).SetModeFor(ctx, db.Pool, ModeLog, "", []string{"orders"}) // the orders relay's switch
			require.NoError(t, err)
			require.Equal(t, ModeClaim, ch.From)
			want = append(want, write(0, 5)...)
		})
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	kc.ConsumeRecords(t, 5, time.Minute, "payments") // the gap's, from keiro_outbox
	want = append(want, write(5, 10)...)
	got := kc.ConsumeRecords(t, 10, time.Minute, "payments") // and the slot's, from the start of the topic
	ids := make([]string, len(got))
	for i, rec := range got {
		for _, h := range rec.Headers {
			if h.Key == "keiro-message-id" {
				ids[i] = string(h.Value)
			}
		}
	}
	require.Equal(t, want, ids, "every payments event once, in the order written")
}
