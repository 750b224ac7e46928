package events_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/keiro-go/keiro/events"
)

// TestReadModelNamesNobodyChose feeds the registry names nobody chose — empty, control
// characters, NUL, bytes that are not UTF-8, long, any Unicode — by registration, lookup, query
// and the asynchronous application. A name PostgreSQL can store round-trips exactly; one it
// cannot is refused up front saying why, before any statement; an unregistered name is refused
// by a query with its name; and the read model registered before them still answers after.
func TestReadModelNamesNobodyChose(t *testing.T) {
	b := setupReadModel(t, true)
	b.run(t, "counter-before", 3)
	require.Equal(t, int64(3), mustAmount(t, b))

	corners := []string{"", "\x00", "a\x00b", "\xff\xfe", "tab\tnew\nline\r", "\x1b[31mred", strings.Repeat("名", 5000),
		"counter-read-model ", " counter-read-model", "COUNTER-READ-MODEL", "'; DROP TABLE keiro_read_models; --"}
	gen := rapid.OneOf(rapid.String(), rapid.StringN(0, 64, 4096), rapid.Map(rapid.SliceOfN(rapid.Byte(), 0, 64), func(b []byte) string { return string(b) }))
	names := append(corners, rapid.SliceOfN(gen, 40, 40).Example(1)...)

	seen := map[string]bool{}
	for _, name := range names {
		m := events.ReadModel{Name: name, Version: 2, ShapeHash: "h-" + name}
		info, err := b.rms.Register(b.ctx, m)
		valid := name != "" && !strings.ContainsRune(name, 0) && strings.ToValidUTF8(name, "") == name
		if !valid {
			require.Error(t, err, "%q", name)
			require.Regexp(t, `is required|is not valid UTF-8|contains a NUL byte`, err.Error())
			_, _, err = b.rms.Lookup(b.ctx, name)
			require.Error(t, err, "lookup of %q", name)
			_, err = b.rms.ApplyTx(b.ctx, nil, events.AsyncProjection{Name: "p", ReadModel: name,
				Apply: func(context.Context, pgx.Tx, events.RecordedEvent) error { return nil }}, events.RecordedEvent{})
			require.Error(t, err, "an application to %q", name)
			continue
		}
		require.NoError(t, err, "%q", name)
		require.Equal(t, name, info.Name)
		if !seen[name] {
			require.Equal(t, int64(2), info.Version)
			require.Equal(t, "h-"+name, info.ShapeHash)
		}
		seen[name] = true
		got, ok, err := b.rms.Lookup(b.ctx, name)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, info.Name, got.Name)
		ran := false
		require.NoError(t, b.rms.Query(b.ctx, m, events.Eventual{}, func(context.Context, pgx.Tx) error { ran = true; return nil }))
		require.True(t, ran, "%q: a registered model answers", name)

		other := name + "\u2063unregistered"
		err = b.rms.Query(b.ctx, events.ReadModel{Name: other, Version: 2, ShapeHash: "h"}, events.Eventual{},
			func(context.Context, pgx.Tx) error { return nil })
		var unregistered *events.ReadModelUnregisteredError
		require.ErrorAs(t, err, &unregistered, "%q", other)
		require.Equal(t, other, unregistered.Name)
	}

	b.run(t, "counter-after", 4)
	require.Equal(t, int64(7), mustAmount(t, b), "the model registered before the junk still answers")
}

func mustAmount(t *testing.T, b *readModelBundle) int64 {
	t.Helper()
	n, err := b.amount("inline", events.Eventual{})
	require.NoError(t, err)
	return n
}
