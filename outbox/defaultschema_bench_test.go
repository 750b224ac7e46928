package outbox_test

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// BenchmarkEnqueueSearchPath commits one-event transactions through a Store of the test's
// schema and through the package-level EnqueueTx, which finds the same outbox on the pool's
// search_path: it resolves once per connection and then checks its outbox in the insert's
// round trip, so the two should be within noise of each other.
func BenchmarkEnqueueSearchPath(b *testing.B) {
	payload := bytes.Repeat([]byte("x"), 200)
	db := testenv.NewDB(b)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(b, err)
	seq := 0
	for _, c := range []struct {
		name    string
		enqueue func(ctx context.Context, tx pgx.Tx, e envelope.Event) error
	}{
		{"store", func(ctx context.Context, tx pgx.Tx, e envelope.Event) error {
			_, err := st.EnqueueTx(ctx, tx, e)
			return err
		}},
		{"package", func(ctx context.Context, tx pgx.Tx, e envelope.Event) error {
			_, err := outbox.EnqueueTx(ctx, tx, e)
			return err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			k := "k"
			for range b.N {
				seq++
				e := envelope.Event{MessageID: "m" + strconv.Itoa(seq), Source: "ordering",
					Destination: "orders", Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON,
					Payload: payload, OccurredAt: time.Now().UTC()}
				require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return c.enqueue(ctx, tx, e) }))
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
		})
	}
}
