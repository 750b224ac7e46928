package workflow_test

import (
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"testing/quick"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/workflow"
)

// Generated ids, step names and values from outside (a message's fields) either are refused
// by our checks (not by the database) and leave nothing recorded, or round-trip exactly to the awaiting run.
func TestGeneratedCompletionsRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, err := workflow.Register(b.e, "echo", func(c *workflow.Context, step string) (string, error) {
		return workflow.Await[string](c, step)
	})
	require.NoError(t, err)
	n := 0
	prop := func(id, step, value string) bool {
		n++
		id = fmt.Sprint(n, id) // unique per case
		if !utf8.ValidString(id) || !utf8.ValidString(step) {
			return true // PostgreSQL text holds UTF-8 only; Go strings from JSON are valid UTF-8
		}
		var startErr error
		_ = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, startErr = w.StartTx(ctx, tx, id, step)
			return startErr
		})
		if startErr != nil {
			_, err := b.e.Instance(ctx, b.db.Pool, "echo", id)
			return err != nil
		}
		var doneErr error
		_ = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, doneErr = b.e.CompleteStepTx(ctx, tx, "echo", id, step, value)
			return doneErr
		})
		out, err := w.Run(ctx, id)
		if err != nil {
			t.Logf("run %q: %v", id, err)
			return false
		}
		if doneErr != nil {
			if strings.Contains(doneErr.Error(), "SQLSTATE") {
				t.Logf("complete %q: %v", id, doneErr)
				return false
			}
			return out == workflow.Suspended || out == workflow.Retrying || out == workflow.Failed
		}
		got, _, ok, err := w.Result(ctx, b.db.Pool, id)
		return err == nil && ok && got == value
	}
	cfg := &quick.Config{MaxCount: 60, Rand: rand.New(rand.NewSource(7)), Values: func(v []reflect.Value, r *rand.Rand) {
		for i := range v {
			v[i] = reflect.ValueOf(randomText(r))
		}
	}}
	require.NoError(t, quick.Check(prop, cfg))
	require.Equal(t, 60, n)
}

// randomText mixes plain text, control characters, NUL, separators and multi-byte runes.
func randomText(r *rand.Rand) string {
	alphabet := []rune{'a', 'Z', '0', '-', '/', ':', ' ', '\x00', '\x1f', '\n', 'é', '界', '😀', '"', '\\', '\'', '%', '_'}
	n := r.Intn(12)
	out := make([]rune, n)
	for i := range out {
		out[i] = alphabet[r.Intn(len(alphabet))]
	}
	return string(out)
}
