package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/markplan"
)

// TestRelayThatLostItsLeaseDoesNotPublish: relay A claims a key's rows and is paused before its
// flush (the hook stands for a SIGSTOP, a GC pause or a cut-off from PostgreSQL): its clock
// moves a lease on while its rows' lease expires and relay B re-claims and publishes them. When
// A resumes it must not publish its stale copies (they would be duplicates, and after a dead
// head, a reorder): each row is on Kafka once, in order, and A counts its rows as lease-lost.
func TestRelayThatLostItsLeaseDoesNotPublish(t *testing.T) {
	t.Parallel()
	const n = 5
	evs := make([]envelope.Event, n)
	for i := range evs {
		evs[i] = ev(fmt.Sprintf("a%d", i), k("A"))
		evs[i].Payload = fmt.Appendf(nil, `{"i":%d}`, i)
	}
	db, _ := setup(t, evs...)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "t1", 1)
	const lease = 10 * time.Second
	logger := slog.New(slog.DiscardHandler)

	var bSettled atomic.Int64
	var bOnce sync.Once
	bDone := make(chan struct{})
	b, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), RelayConfig{Schema: db.Schema, Lease: lease, Logger: logger,
		PollInterval: 50 * time.Millisecond, OnBatch: func(res BatchResult) {
			if bSettled.Add(int64(res.Published)) >= n {
				bOnce.Do(func() { close(bDone) })
			}
		}})
	require.NoError(t, err)

	aMarked := make(chan BatchResult, 10)
	// One batch in flight: A cannot re-claim the expired rows itself while it is "paused".
	a, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), RelayConfig{Schema: db.Schema, Lease: lease, Logger: logger,
		PollInterval: time.Hour, MaxInFlightBatches: 1, OnBatch: func(res BatchResult) { aMarked <- res }})
	require.NoError(t, err)
	var skew atomic.Int64
	a.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	var once sync.Once
	a.flushHook = func() {
		once.Do(func() {
			// A is "paused": its lease runs out, B takes the rows over and publishes them.
			_, err := db.Pool.Exec(context.Background(), "UPDATE keiro_outbox SET lease_until = now() - interval '1 second'")
			require.NoError(t, err)
			runRelay(t, b)
			select {
			case <-bDone:
			case <-time.After(30 * time.Second):
				t.Error("relay B did not publish the rows taken over")
			}
			skew.Store(int64(lease)) // A resumes a lease later
		})
	}
	runRelay(t, a)
	select {
	case res := <-aMarked:
		require.Zero(t, res.Published, "the relay that lost its lease published")
	case <-time.After(30 * time.Second):
		t.Fatal("relay A never marked its batch")
	}
	require.Positive(t, a.Stats().LeaseLost) // the first row; the key's others are held back behind it
	require.Zero(t, a.Stats().Published)

	recs := kc.ConsumeRecords(t, n+1, 2*time.Second, "t1") // n+1: a duplicate would show
	require.Len(t, recs, n, "each row on Kafka once")
	for i, rec := range recs {
		require.Equal(t, fmt.Sprintf(`{"i":%d}`, i), string(rec.Value))
	}
	var sent int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM keiro_outbox WHERE status = 'sent'").Scan(&sent))
	require.Equal(t, n, sent)
}

// TestMarkStoresAnErrorCutThroughACharacter: an error text longer than the stored limit with a
// multi-byte character across the cut is stored cut before that character. A byte cut made
// PostgreSQL refuse the mark (invalid UTF-8), which was retried, lease renewed, forever.
func TestMarkStoresAnErrorCutThroughACharacter(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")))
	kc := testenv.NewKafka(t)
	r, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), RelayConfig{Schema: db.Schema, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	token, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	msg := strings.Repeat("x", markplan.MaxErrorBytes-1) + "é and more" // é's two bytes straddle the limit
	b := &claimedBatch{token: token, rows: rows, results: []produceResult{{done: true, err: errors.New(msg)}}, leasedAt: time.Now()}
	res := r.markOutcome(ctx, b)
	require.Equal(t, 1, res.Retried)
	require.Zero(t, r.Stats().MarkErrors)
	var got, le string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT status, last_error FROM keiro_outbox WHERE message_id = 'a1'").Scan(&got, &le))
	require.Equal(t, "failed", got)
	require.Equal(t, strings.Repeat("x", markplan.MaxErrorBytes-1), le)
}

// TestMarkRefusedForeverIsGivenUp: a mark PostgreSQL refuses every time (a trigger here) is
// given up after maxMarkRefusals tries rather than retried, with its lease renewed, forever; the
// rows come back through their lease and are published once the refusal is gone.
func TestMarkRefusedForeverIsGivenUp(t *testing.T) {
	t.Parallel()
	db, _ := setup(t, ev("a1", k("A")))
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
CREATE FUNCTION refuse_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'mark refused for the test' USING ERRCODE = '22023'; END $$;
CREATE TRIGGER refuse_mark BEFORE UPDATE ON keiro_outbox FOR EACH ROW
    WHEN (OLD.status = 'publishing' AND NEW.status <> 'publishing') EXECUTE FUNCTION refuse_mark();`)
	require.NoError(t, err)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "t1", 1)
	marked := make(chan BatchResult, 10)
	r, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), RelayConfig{Schema: db.Schema, Lease: time.Second,
		PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), OnBatch: func(res BatchResult) { marked <- res }})
	require.NoError(t, err)
	runRelay(t, r)
	select {
	case res := <-marked:
		require.Zero(t, res.Published)
	case <-time.After(30 * time.Second):
		t.Fatal("the refused mark was never given up")
	}
	s := r.Stats()
	require.EqualValues(t, 1, s.MarksAbandoned)
	require.EqualValues(t, maxMarkRefusals, s.MarkErrors)
	got, _ := status(t, db, "a1")
	require.Equal(t, "publishing", got, "the row waits for its lease")

	_, err = db.Pool.Exec(ctx, "DROP TRIGGER refuse_mark ON keiro_outbox")
	require.NoError(t, err)
	deadline := time.After(30 * time.Second)
	for published := 0; published == 0; {
		select {
		case res := <-marked:
			published = res.Published
		case <-deadline:
			t.Fatal("the row was not published after its lease expired")
		}
	}
	require.Positive(t, r.Stats().Reclaimed)
}
