package logslot

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestName(t *testing.T) {
	if got := Name("keiro", nil); got != "keiro_keiro_log" {
		t.Fatalf("Name(keiro, nil) = %q", got)
	}
	a := Name("keiro", []string{"payments", "orders", "orders"})
	b := Name("keiro", []string{"orders", "payments"})
	if a != b {
		t.Fatalf("order or duplicates change the name: %q, %q", a, b)
	}
	if c := Name("keiro", []string{"orders"}); c == a {
		t.Fatalf("another set, the same name %q", c)
	}
	// Sets that would collide if their names were joined without a separator.
	if Name("keiro", []string{"ab", "c"}) == Name("keiro", []string{"a", "bc"}) {
		t.Fatal("{ab, c} and {a, bc} share a name")
	}
	valid := regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	long := make([]string, 100)
	for i := range long {
		long[i] = strings.Repeat("Topic.With-Upper", 10) + string(rune('a'+i%26))
	}
	for _, n := range []string{a, Name(strings.Repeat("s", 40), long)} {
		if !valid.MatchString(n) {
			t.Errorf("%q is not a valid slot name", n)
		}
	}
}

func TestRowFilterRoundTrip(t *testing.T) {
	if RowFilter(nil) != "" || ParseRowFilter("") != nil {
		t.Fatal("no destinations is no filter")
	}
	if got := RowFilter([]string{"b", "a", "b"}); got != " WHERE (destination IN ('a', 'b'))" {
		t.Fatalf("RowFilter = %q", got)
	}
	// PostgreSQL's deparse of RowFilter's clause, for one and for several destinations.
	for filter, want := range map[string][]string{
		"(destination = 'orders'::text)":                                   {"orders"},
		"(destination = ANY (ARRAY['payments'::text, 'orders.v1'::text]))": {"orders.v1", "payments"},
	} {
		if got := ParseRowFilter(filter); !slices.Equal(got, want) {
			t.Errorf("ParseRowFilter(%q) = %q, want %q", filter, got, want)
		}
	}
}

func TestOverlap(t *testing.T) {
	for _, c := range []struct {
		a, b, want []string
	}{
		{nil, nil, []string{"*"}},
		{nil, []string{"b", "a"}, []string{"a", "b"}},
		{[]string{"a"}, nil, []string{"a"}},
		{[]string{"a", "b"}, []string{"c"}, nil},
		{[]string{"a", "b"}, []string{"b", "c"}, []string{"b"}},
	} {
		if got := Overlap(c.a, c.b); !slices.Equal(got, c.want) {
			t.Errorf("Overlap(%q, %q) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}
