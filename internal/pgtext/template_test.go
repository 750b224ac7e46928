package pgtext

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExpandFillsEveryPlaceholder(t *testing.T) {
	q := Expand("SELECT {{cols}} FROM {{schema}}.t WHERE {{schema}}.t.a = 1", "schema", `"s"`, "cols", "a, b")
	require.Equal(t, `SELECT a, b FROM "s".t WHERE "s".t.a = 1`, q)
}

func TestExpandRefusesWhatIsLeft(t *testing.T) {
	require.PanicsWithValue(t, `pgtext.Expand: placeholder {{table}} left unfilled in "SELECT 1 FROM {{table}}"`,
		func() { Expand("SELECT 1 FROM {{table}}", "schema", "s") })
	require.Panics(t, func() { Expand("SELECT 1", "schema") })
}

func TestPartialLeavesTheRest(t *testing.T) {
	q := Partial("{{a}} {{b}}", "a", "1")
	require.Equal(t, "1 {{b}}", q)
	require.Equal(t, "1 2", Expand(q, "b", "2"))
}
