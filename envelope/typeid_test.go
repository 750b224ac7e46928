package envelope_test

import (
	"strings"
	"testing"

	"github.com/keiro-go/keiro/envelope"
)

// TestTypeIDVectors pins the TypeID encoding on the specification's own examples and on
// vectors that follow from its bit layout.
func TestTypeIDVectors(t *testing.T) {
	for _, tc := range []struct{ prefix, uuid, want string }{
		{"", "00000000-0000-0000-0000-000000000000", "00000000000000000000000000"},
		{"", "00000000-0000-0000-0000-000000000001", "00000000000000000000000001"},
		{"", "00000000-0000-0000-0000-00000000000a", "0000000000000000000000000a"},
		{"", "00000000-0000-0000-0000-000000000010", "0000000000000000000000000g"},
		{"", "00000000-0000-0000-0000-000000000020", "00000000000000000000000010"},
		{"", "ffffffff-ffff-ffff-ffff-ffffffffffff", "7zzzzzzzzzzzzzzzzzzzzzzzzz"},
		{"prefix", "01890a5d-ac96-774b-bcce-b302099a8057", "prefix_01h455vb4pex5vsknk084sn02q"},
		{"pre_fix", "00000000-0000-0000-0000-000000000000", "pre_fix_00000000000000000000000000"},
	} {
		id, err := envelope.ParseUUID(tc.uuid)
		if err != nil {
			t.Fatal(err)
		}
		got, err := envelope.FormatTypeID(tc.prefix, id)
		if err != nil || got != tc.want {
			t.Fatalf("FormatTypeID(%q, %s) = %q, %v; want %q", tc.prefix, tc.uuid, got, err, tc.want)
		}
		prefix, back, err := envelope.ParseTypeID(got)
		if err != nil || prefix != tc.prefix || back != id {
			t.Fatalf("ParseTypeID(%q) = %q, %s, %v", got, prefix, back, err)
		}
	}
}

// TestTypeIDRejects: prefixes and suffixes the specification does not allow.
func TestTypeIDRejects(t *testing.T) {
	id := envelope.NewUUIDv7()
	for _, p := range []string{"Msg", "msg-1", "_msg", "msg_", "msg1", strings.Repeat("a", 64), "é"} {
		if _, err := envelope.FormatTypeID(p, id); err == nil {
			t.Errorf("FormatTypeID(%q) accepted", p)
		}
	}
	for _, s := range []string{
		"", "msg_", "msg_0000000000000000000000000", // 25 characters
		"msg_80000000000000000000000000", // overflows 128 bits
		"msg_0000000000000000000000000u", // u is not in the alphabet
		"msg_0000000000000000000000000A", // upper case
		"_00000000000000000000000000", "msg00000000000000000000000000", "Msg_00000000000000000000000000",
	} {
		if _, _, err := envelope.ParseTypeID(s); err == nil {
			t.Errorf("ParseTypeID(%q) accepted", s)
		}
	}
}

// TestNewTypeIDIsFreshAndOrdered: fresh TypeIDs carry the prefix, decode to UUIDv7s, differ,
// and sort in creation order.
func TestNewTypeIDIsFreshAndOrdered(t *testing.T) {
	prev := ""
	seen := map[string]bool{}
	for range 1000 {
		s, err := envelope.NewTypeID("msg")
		if err != nil {
			t.Fatal(err)
		}
		prefix, id, err := envelope.ParseTypeID(s)
		if err != nil || prefix != "msg" || id[6]>>4 != 7 {
			t.Fatalf("ParseTypeID(%q) = %q, %s, %v", s, prefix, id, err)
		}
		if seen[s] || s <= prev {
			t.Fatalf("%q after %q: not fresh and increasing", s, prev)
		}
		seen[s], prev = true, s
	}
}

// FuzzParseTypeID: any string either fails to parse or is the canonical TypeID of what it
// parses to, and a parsed UUID formats back to the same string.
func FuzzParseTypeID(f *testing.F) {
	for _, s := range []string{"msg_01h455vb4pex5vsknk084sn02q", "00000000000000000000000000", "7zzzzzzzzzzzzzzzzzzzzzzzzz",
		"msg_80000000000000000000000000", "a_b_0000000000000000000000000g", "_", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		prefix, id, err := envelope.ParseTypeID(s)
		if err != nil {
			return
		}
		back, err := envelope.FormatTypeID(prefix, id)
		if err != nil || back != s {
			t.Fatalf("ParseTypeID(%q) = %q, %s; FormatTypeID gives %q, %v", s, prefix, id, back, err)
		}
	})
}
