package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/internal/shares"
	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

// TestClaimSharesSplitTheRows: a claim restricted to some claim shares takes only the rows of
// those shares, every key's rows together (a key is in one share), and null-key rows too; the
// complementary shares' claim takes the rest, so together they claim every row once. An
// unrestricted claim (shares.All, or no share held) claims everything, as before shares.
func TestClaimSharesSplitTheRows(t *testing.T) {
	t.Parallel()
	var evs []envelope.Event
	for i := range 300 {
		var key *string
		if i%10 != 9 {
			key = k(fmt.Sprintf("k%d", i%40))
		}
		evs = append(evs, ev(fmt.Sprintf("m%03d", i), key))
	}
	db, st := setup(t, evs...)
	ctx := context.Background()
	share := func(mask shares.Mask) map[string]bool {
		rows, err := db.Pool.Query(ctx, "SELECT message_id FROM keiro_outbox r WHERE "+
			fmt.Sprintf(sqlq.InShare, "$1", fmt.Sprintf(sqlq.ShareOfKey, "r")), int64(mask))
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		out := map[string]bool{}
		for _, id := range ids {
			out[id] = true
		}
		return out
	}
	even := shares.Mask(0x5555_5555_5555_5555)
	inEven := share(even)
	require.NotEmpty(t, inEven)
	require.Less(t, len(inEven), len(evs), "every row fell into the even shares")
	var keyed, unkeyed int
	for _, e := range evs {
		if inEven[e.MessageID] {
			if e.Key == nil {
				unkeyed++
			} else {
				keyed++
			}
		}
	}
	require.Positive(t, keyed)
	require.Positive(t, unkeyed, "null-key rows are spread over the shares too")

	for _, deep := range []bool{false, true} {
		t.Run(fmt.Sprintf("deep=%v", deep), func(t *testing.T) {
			_, err := db.Pool.Exec(ctx, "UPDATE keiro_outbox SET status = 'pending', claim_token = NULL, lease_until = NULL, attempt_count = 0")
			require.NoError(t, err)
			budget := len(evs)
			if deep {
				budget = 0 // sqlClaimKeys
			}
			claimed := map[string]int{}
			for _, m := range []shares.Mask{even, ^even} {
				for {
					_, rows, err := claimsOf(st).ClaimIn(ctx, db.Pool, PerKeyHeadOfLine, 1000, time.Minute, 10, nil, budget, m, claimsql.KeyCursor{})
					require.NoError(t, err)
					if len(rows) == 0 {
						break
					}
					for _, r := range rows {
						require.Equal(t, m == even, inEven[r.Event.MessageID], "row %s claimed outside shares %x", r.Event.MessageID, m)
						claimed[r.Event.MessageID]++
					}
					_, err = db.Pool.Exec(ctx, "UPDATE keiro_outbox SET status = 'sent', published_at = now(), claim_token = NULL, lease_until = NULL WHERE status = 'publishing'")
					require.NoError(t, err)
				}
			}
			require.Len(t, claimed, len(evs), "rows claimed by the two halves")
			for id, n := range claimed {
				require.Equal(t, 1, n, "row %s", id)
			}
		})
	}
	_, err := db.Pool.Exec(ctx, "UPDATE keiro_outbox SET status = 'pending', claim_token = NULL, lease_until = NULL")
	require.NoError(t, err)
	for _, m := range []shares.Mask{shares.All, 0} {
		tok, rows, err := claimsOf(st).ClaimIn(ctx, db.Pool, BestEffort, 1000, time.Minute, 10, nil, 0, m, claimsql.KeyCursor{})
		require.NoError(t, err)
		require.Len(t, rows, len(evs), "shares %x", m)
		_, err = db.Pool.Exec(ctx, "UPDATE keiro_outbox SET status = 'pending', claim_token = NULL, lease_until = NULL WHERE claim_token = $1", [16]byte(tok))
		require.NoError(t, err)
	}
}

// shareRig starts relays on one outbox with kfake; each relay's balance steps can be held
// (hold), as a relay paused or cut off would be.
type shareRig struct {
	t      *testing.T
	db     *testenv.DB
	st     *Store
	kc     *testenv.Kafka
	relays []*shareRelay
}

type shareRelay struct {
	*Relay
	stop context.CancelFunc
	done chan error
	// hold, while set, stops the relay's balance steps (its hook waits).
	hold      atomic.Bool
	published atomic.Int64
}

func newShareRig(t *testing.T) *shareRig {
	db, st := setup(t)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "t1", 3)
	kc.CreateTopic(t, "t2", 3)
	return &shareRig{t: t, db: db, st: st, kc: kc}
}

// start starts a relay with cfg (Schema and a short PollInterval set).
func (g *shareRig) start(cfg RelayConfig) *shareRelay {
	cfg.Schema = g.db.Schema
	cfg.PollInterval = 20 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	sr := &shareRelay{done: make(chan error, 1)}
	cfg.OnBatch = func(b BatchResult) { sr.published.Add(int64(b.Published)) }
	r, err := NewRelay(g.db.Pool, g.kc.NewClient(g.t, ProducerOpts()...), cfg)
	require.NoError(g.t, err)
	sr.Relay = r
	r.shareHook = func(ctx context.Context) {
		for sr.hold.Load() && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	sr.stop = cancel
	go func() { sr.done <- r.Run(ctx) }()
	g.t.Cleanup(func() {
		sr.hold.Store(false)
		cancel()
		require.NoError(g.t, <-sr.done)
	})
	g.relays = append(g.relays, sr)
	return sr
}

// waitShares waits until the relays' shares and share group sizes are want and members.
func (g *shareRig) waitShares(relays []*shareRelay, want []int64, members int64) {
	g.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := make([]int64, len(relays))
		ok := true
		for i, r := range relays {
			s := r.Stats()
			got[i] = s.Shares
			ok = ok && s.ShareMembers == members
		}
		sorted := slices.Clone(got)
		slices.Sort(sorted)
		if ok && slices.Equal(sorted, want) {
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("shares %v (want %v, sorted) with %d members", got, want, members)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// drain enqueues n rows over keys keys of topic and waits until relays published them all.
func (g *shareRig) drain(topic string, n, keys int) {
	g.t.Helper()
	evs := make([]envelope.Event, n)
	for i := range evs {
		evs[i] = ev(fmt.Sprintf("%s-%d-%05d", topic, time.Now().UnixNano(), i), k(fmt.Sprintf("k%d", i%keys)))
		evs[i].Destination = topic
	}
	before := g.published()
	require.NoError(g.t, pgx.BeginFunc(context.Background(), g.db.Pool, func(tx pgx.Tx) error {
		_, err := g.st.EnqueueTx(context.Background(), tx, evs...)
		return err
	}))
	deadline := time.Now().Add(60 * time.Second)
	for g.published()-before < int64(n) {
		if time.Now().After(deadline) {
			g.t.Fatalf("published %d of %d", g.published()-before, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var open int
	require.NoError(g.t, g.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM keiro_outbox WHERE phase = 0").Scan(&open))
	require.Zero(g.t, open)
}

func (g *shareRig) published() int64 {
	var n int64
	for _, r := range g.relays {
		n += r.published.Load()
	}
	return n
}

// TestRelaysSplitTheShares: three relays of one share group each hold a third of the 64 claim
// shares (22, 21 and 21, or 22, 22 and 20); a stopped relay's shares, and those of a relay whose
// share session was terminated (it can no longer take part: its balance steps are held), are
// taken by the others, which then hold all 64 between them and publish every row; the relay
// cut off rejoins once its steps resume.
func TestRelaysSplitTheShares(t *testing.T) {
	t.Parallel()
	g := newShareRig(t)
	a, b, c := g.start(RelayConfig{}), g.start(RelayConfig{}), g.start(RelayConfig{})
	thirds := func(rs ...*shareRelay) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var sum int64
			ok := true
			for _, r := range rs {
				s := r.Stats()
				sum += s.Shares
				ok = ok && s.ShareMembers == 3 && s.Shares >= 20 && s.Shares <= 22
			}
			if ok && sum == shares.Count {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("shares %d %d %d", rs[0].Stats().Shares, rs[1].Stats().Shares, rs[2].Stats().Shares)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	thirds(a, b, c)
	g.drain("t1", 2000, 500)

	// A relay cut off: its share session ends, and it cannot rejoin while its steps are held.
	c.hold.Store(true)
	pid := c.shares.PID()
	require.NotZero(t, pid)
	var killed bool
	require.NoError(t, g.db.Pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", int64(pid)).Scan(&killed))
	require.True(t, killed)
	g.waitShares([]*shareRelay{a, b}, []int64{32, 32}, 2)
	g.drain("t1", 2000, 500)
	c.hold.Store(false)
	thirds(a, b, c)

	// A stopped relay.
	c.stop()
	require.NoError(t, <-c.done)
	c.done <- nil // for the cleanup
	g.waitShares([]*shareRelay{a, b}, []int64{32, 32}, 2)
	before := c.published.Load()
	g.drain("t1", 2000, 500)
	require.Equal(t, before, c.published.Load())
	require.Zero(t, c.Stats().Shares)
}

// TestRelaysWithDifferentDestinationsDoNotSplit: relays of different destination filters are
// different share groups, each alone holding all 64 shares of its own; relays whose filters
// name the same topics in another order are one group and split them.
func TestRelaysWithDifferentDestinationsDoNotSplit(t *testing.T) {
	t.Parallel()
	g := newShareRig(t)
	all := g.start(RelayConfig{})
	t1 := g.start(RelayConfig{Destinations: []string{"t1"}})
	t2 := g.start(RelayConfig{Destinations: []string{"t2"}})
	g.waitShares([]*shareRelay{all, t1, t2}, []int64{64, 64, 64}, 1)
	both := g.start(RelayConfig{Destinations: []string{"t1", "t2"}})
	bothAgain := g.start(RelayConfig{Destinations: []string{"t2", "t1", "t2"}})
	g.waitShares([]*shareRelay{both, bothAgain}, []int64{32, 32}, 2)
	g.waitShares([]*shareRelay{all, t1, t2}, []int64{64, 64, 64}, 1)
	g.drain("t1", 1000, 100)
	g.drain("t2", 1000, 100)
}

// TestRelayAloneClaimsUnrestricted: the only relay of its group holds every share and runs
// exactly the claim of a relay without shares; a PollOnly relay holds none and claims
// unrestricted too.
func TestRelayAloneClaimsUnrestricted(t *testing.T) {
	t.Parallel()
	g := newShareRig(t)
	r := g.start(RelayConfig{BatchSize: 50})
	g.waitShares([]*shareRelay{r}, []int64{64}, 1)
	g.drain("t1", 3000, 300)
	require.Zero(t, r.Stats().ShareClaims)
	require.Greater(t, r.Stats().Claims, int64(3000/50))

	p := newShareRig(t)
	po := p.start(RelayConfig{BatchSize: 50, PollOnly: true})
	p.drain("t1", 1000, 100)
	s := po.Stats()
	require.Zero(t, s.Shares)
	require.Zero(t, s.ShareMembers)
	require.Zero(t, s.ShareClaims)
}
