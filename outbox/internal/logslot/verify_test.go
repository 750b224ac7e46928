package logslot

import (
	"strings"
	"testing"
)

// TestCheckPublication: the verdict on each kind of publication a relay may find.
func TestCheckPublication(t *testing.T) {
	for _, c := range []struct {
		name  string
		p     *Publication
		dests []string
		v     Verdict
		lost  bool
		msg   string
	}{
		{"missing", nil, nil, Create, false, ""},
		{"as expected", &Publication{Name: "s", InsertOnly: true, Tables: 1, Ours: true}, nil, Use, false, ""},
		{"filtered", &Publication{Name: "s", InsertOnly: true, Tables: 1, Ours: true, RowFilter: "(destination = 'a'::text)"}, []string{"a"}, Use, false, ""},
		{"all tables", &Publication{Name: "s", AllTables: true, Tables: 9, Ours: true}, nil, Refuse, false, "FOR ALL TABLES"},
		{"other table", &Publication{Name: "s", InsertOnly: true, Tables: 2, Ours: true, Others: "x.other"}, nil, Refuse, false, "other tables (x.other)"},
		{"another table only", &Publication{Name: "s", InsertOnly: true, Tables: 1, Others: "x.other"}, nil, Refuse, false, "other tables"},
		{"no table", &Publication{Name: "s", InsertOnly: true}, nil, Repair, true, "publishes no table"},
		{"other operations", &Publication{Name: "s", Tables: 1, Ours: true}, nil, Repair, false, "other operations"},
		{"another set", &Publication{Name: "s", InsertOnly: true, Tables: 1, Ours: true}, []string{"a"}, Refuse, false, "publishes every destination"},
	} {
		v, lost, err := CheckPublication(c.p, "k", c.dests)
		if v != c.v || lost != c.lost || (c.msg == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.msg)) {
			t.Errorf("%s: got %v %v %v, want %v %v %q", c.name, v, lost, err, c.v, c.lost, c.msg)
		}
	}
	if err := MissedError(nil, "s", []string{"b", "a"}); !strings.Contains(err.Error(), "relay mode prepare --log-slot=s --destinations=a,b") ||
		!strings.Contains(err.Error(), "relay mode recover --since=<when the table was created again> --destinations=a,b") {
		t.Errorf("MissedError: %v", err)
	}
}

// TestCheckSlot: a slot of another kind, database or plugin, or an invalidated one, is refused.
func TestCheckSlot(t *testing.T) {
	ok := Slot{Name: "s", Type: "logical", Plugin: "pgoutput", Database: "d", Current: "d", WALStatus: "reserved"}
	if err := CheckSlot(&ok); err != nil {
		t.Fatal(err)
	}
	for msg, s := range map[string]Slot{
		"not a logical one":             {Name: "s", Type: "physical", Database: "", Current: "d"},
		"belongs to the database other": {Name: "s", Type: "logical", Plugin: "pgoutput", Database: "other", Current: "d"},
		"plugin test_decoding":          {Name: "s", Type: "logical", Plugin: "test_decoding", Database: "d", Current: "d"},
		"wal_status lost":               {Name: "s", Type: "logical", Plugin: "pgoutput", Database: "d", Current: "d", WALStatus: "lost"},
		"rows_removed":                  {Name: "s", Type: "logical", Plugin: "pgoutput", Database: "d", Current: "d", Invalidated: "rows_removed"},
	} {
		if err := CheckSlot(&s); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v", msg, err)
		}
	}
}
