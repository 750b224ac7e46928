package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// In ModeLog the claim loop beside the slot (the rows enqueued before the switch, requeued
// dead letters) publishes exactly once too when ExactlyOnce is set: in Kafka transactions, its
// claims naming its transactional id.
func TestLogModeClaimLoopPublishesExactlyOnce(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 3)
	ctx := context.Background()
	const n = 30
	enqueue(t, db.Pool, st, keyedEvents("orders", n, 5)...) // claim mode: rows of keiro_outbox
	r := startLogRelay(t, db, kc, st, outbox.RelayConfig{ExactlyOnce: true})
	testenv.WaitFor(t, time.Minute, "the rows enqueued before the switch are sent", func() bool {
		var sent int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox WHERE status = 'sent'").Scan(&sent))
		return sent == n
	})
	eos, ok := r.ExactlyOnce()
	require.True(t, ok)
	require.Positive(t, eos.Committed)
	var named int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox WHERE claim_txn = $1", eos.TransactionalID).Scan(&named))
	require.Equal(t, n, named)
	distinct, dups := checkOrder(t, kc.ConsumeRecords(t, n+1, 2*time.Second, "orders"))
	require.Equal(t, n, distinct)
	require.Zero(t, dups)
}
