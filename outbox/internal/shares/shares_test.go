package shares

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A group is named by its distinct destinations, in any order.
func TestGroup(t *testing.T) {
	require.Equal(t, "", group(nil))
	require.Equal(t, "a,b", group([]string{"b", "a", "b"}))
	require.Equal(t, group([]string{"x", "y"}), group([]string{"y", "x"}))
}

func TestMaskCount(t *testing.T) {
	require.Equal(t, Count, All.Count())
	require.Equal(t, 0, Mask(0).Count())
	require.Equal(t, 32, Mask(0x5555_5555_5555_5555).Count())
}

// Two relays of a group split the shares between them, disjoint and together every share; a
// relay of another group holds every share of its own; the shares of a relay that leaves go
// to the one that stays.
func TestSetsSplitTheShares(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	q := sqlq.New(db.Schema)
	cfg := db.Pool.Config().ConnConfig
	newSet := func(destinations ...string) *Set {
		s := New(cfg, q, destinations)
		t.Cleanup(s.Close)
		return s
	}
	balance := func(sets ...*Set) {
		t.Helper()
		for _, s := range sets {
			require.NoError(t, s.Balance(ctx))
		}
	}
	a, b := newSet("t1", "t2"), newSet("t2", "t1")
	balance(a)
	require.Equal(t, All, a.Shares(), "alone in its group")
	require.Equal(t, int64(1), a.Members())
	require.NotZero(t, a.PID())
	balance(b, a, b)
	require.Equal(t, 32, a.Shares().Count())
	require.Equal(t, 32, b.Shares().Count())
	require.Zero(t, a.Shares()&b.Shares(), "a share is held by one relay")
	require.Equal(t, All, a.Shares()|b.Shares())
	require.Equal(t, int64(2), b.Members())

	c := newSet("t1")
	balance(c)
	require.Equal(t, All, c.Shares(), "another group does not split with them")
	require.Equal(t, int64(1), c.Members())

	pid := a.PID()
	a.Close()
	require.Zero(t, a.Shares())
	require.Zero(t, a.PID())
	// The server releases the locks of a closed session when its backend exits.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_catalog.pg_locks WHERE pid = $1", pid).Scan(&n))
		return n == 0
	}, 10*time.Second, 5*time.Millisecond, "the closed session's backend kept its locks")
	balance(b)
	require.Equal(t, All, b.Shares(), "the remaining relay takes the shares of the one that left")
	require.Equal(t, int64(1), b.Members())
}
