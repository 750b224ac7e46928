package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The failure groups put failed rows whose errors differ only by ids, long hex runs and numbers
// in one group per class (poisoned or retrying), largest first; another consumer's rows, an
// archived row and a different message stay out of a group.
func TestFailureGroupsNormaliseErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.MaxAttempts = 1 })
	other := newStore(t, db, func(c *inbox.StoreConfig) { c.Consumer = "shipping"; c.MaxAttempts = 1 })
	failWith := func(st *inbox.Store, msg string) inbox.Key {
		t.Helper()
		ev := newEvent("src", "t")
		res, err := st.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, func(context.Context, pgx.Tx, envelope.Event) error {
			return errors.New(msg)
		})
		require.NoError(t, err)
		return inbox.Key{Source: ev.Source, DedupeKey: res.DedupeKey}
	}
	a := failWith(s, "order 41 of 0191a2b3-c4d5-7e6f-8a9b-0c1d2e3f4a5b: tx deadbeefdeadbeef00 failed after 2.5 s")
	b := failWith(s, "order 42 of 0191a2b3-c4d5-7e6f-8a9b-ffffffffffff: tx 0123456789abcdef01 failed after 10 s")
	archived := failWith(s, "order 43 of 0191a2b3-c4d5-7e6f-8a9b-000000000000: tx 00000000000000000a failed after 1 s")
	failWith(s, "payment refused")
	failWith(other, "order 44 of 0191a2b3-c4d5-7e6f-8a9b-000000000001: tx 00000000000000000b failed after 1 s")
	got, err := inbox.NewAdmin(s).Archive(ctx, db.Pool, []inbox.Key{archived})
	require.NoError(t, err)
	require.Len(t, got, 1)

	groups, err := inbox.NewAdmin(s).FailureGroups(ctx, db.Pool, 10)
	require.NoError(t, err)
	require.Len(t, groups, 2)
	g := groups[0]
	require.Equal(t, "poisoned", g.Class)
	require.Equal(t, "order <n> of <id>: tx <hex> failed after <n> s", g.Message)
	require.EqualValues(t, 2, g.Count, "the archived row and shipping's row are not in it")
	require.Equal(t, []string{"src"}, g.Where)
	require.Contains(t, []string{
		"order 41 of 0191a2b3-c4d5-7e6f-8a9b-0c1d2e3f4a5b: tx deadbeefdeadbeef00 failed after 2.5 s",
		"order 42 of 0191a2b3-c4d5-7e6f-8a9b-ffffffffffff: tx 0123456789abcdef01 failed after 10 s",
	}, g.Example)
	require.False(t, g.First.After(g.Last))
	require.Equal(t, "payment refused", groups[1].Message)
	require.EqualValues(t, 1, groups[1].Count)

	keys, err := inbox.NewAdmin(s).FailureGroupKeys(ctx, db.Pool, g.Class, g.Message, 10)
	require.NoError(t, err)
	require.Equal(t, []inbox.Key{a, b}, keys, "oldest failure first")
	keys, err = inbox.NewAdmin(s).FailureGroupKeys(ctx, db.Pool, g.Class, g.Message, 1)
	require.NoError(t, err)
	require.Equal(t, []inbox.Key{a}, keys)
	keys, err = inbox.NewAdmin(s).FailureGroupKeys(ctx, db.Pool, "retrying", g.Message, 10)
	require.NoError(t, err)
	require.Empty(t, keys, "the class is part of the group")

	top, err := inbox.NewAdmin(s).FailureGroups(ctx, db.Pool, 1)
	require.NoError(t, err)
	require.Len(t, top, 1)
	_, err = inbox.NewAdmin(s).FailureGroups(ctx, db.Pool, 0)
	require.Error(t, err)
	_, err = inbox.NewAdmin(s).FailureGroupKeys(ctx, db.Pool, g.Class, g.Message, 0)
	require.Error(t, err)
}
