package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
)

// TestClaimWhoseReplyWasLostIsReleased: the relay's first claim commits, then its backend is
// terminated and its connection breaks before any of its reply is read, so the relay sees
// only an error while its rows are publishing under its token with a lease of ten minutes. The
// relay releases them as soon as the database answers again: every row is published, and the
// release is counted, long before the lease could have run out.
func TestClaimWhoseReplyWasLostIsReleased(t *testing.T) {
	t.Parallel()
	const n = 40
	evs := make([]envelope.Event, n)
	for i := range evs {
		evs[i] = ev(fmt.Sprintf("m%02d", i), k(fmt.Sprintf("k%d", i%8)))
	}
	db, _ := setup(t, evs...)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "t1", 2)

	var settled int
	var mu sync.Mutex
	done := make(chan struct{})
	r, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), RelayConfig{Schema: db.Schema,
		Lease: 10 * time.Minute, PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		OnBatch: func(res BatchResult) {
			mu.Lock()
			defer mu.Unlock()
			if settled += res.Published; settled == n {
				close(done)
			}
		}})
	require.NoError(t, err)
	lostRows := make(chan int, 1)
	var once sync.Once
	r.claims.ClaimSent = func(q claimsql.BatchSender, token envelope.UUID) {
		once.Do(func() {
			ctx := context.Background()
			conn := q.(*pgxpool.Conn)
			// Wait for the claim to commit: its rows become visible under its token. (A
			// query loop on the outcome, not a sleep: the claim was sent and commits on its own.)
			var claimed int
			for claimed == 0 {
				require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM keiro_outbox WHERE claim_token = $1",
					[16]byte(token)).Scan(&claimed))
			}
			_, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", int64(conn.Conn().PgConn().PID()))
			require.NoError(t, err)
			_ = conn.Conn().PgConn().Conn().Close() // the reply never reaches the relay
			lostRows <- claimed
		})
	}
	runRelay(t, r)
	var lost int
	select {
	case lost = <-lostRows:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never claimed")
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%d of %d rows published: the lost claim's rows stayed held under its lease", settled, n)
	}
	require.Positive(t, r.Stats().ClaimErrors)
	require.Equal(t, int64(lost), r.Stats().Released, "the lost claim's rows were released")
	var attempts int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT max(attempt_count) FROM keiro_outbox").Scan(&attempts))
	require.Equal(t, 1, attempts, "the lost claim's attempt was refunded")
}
