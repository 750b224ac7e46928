// Package logslot holds the one rule of log mode's slot names and destination sets: the
// default slot of a schema and of a destination set, the publication's row filter that gives a
// slot only its destinations' rows, and the reading of that filter back from the catalog. The
// outbox (Admin.SetMode, the relay's checks, retention, status) and the log-mode engine (which
// creates the publication when it is missing) both use it.
package logslot

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"slices"
	"strings"
)

// Name is the default slot (and publication) of schema's log mode for the destination set
// dests: "<schema>_keiro_log" for every destination (dests empty), and
// "<schema>_keiro_log_<hash>" for a set, hash being the first 12 hexadecimal digits of the
// SHA-256 of the sorted, deduplicated destinations joined by a NUL byte. The name is the same
// for the same set in any order; it is a valid slot name when the schema's name is at most
// 40 characters (schemas are lower case: migrations.ValidateSchema).
func Name(schema string, dests []string) string {
	set := Normalize(dests)
	if len(set) == 0 {
		return schema + "_keiro_log"
	}
	sum := sha256.Sum256([]byte(strings.Join(set, "\x00")))
	return schema + "_keiro_log_" + hex.EncodeToString(sum[:6])
}

// Normalize returns dests sorted and deduplicated, in a new slice (nil for none).
func Normalize(dests []string) []string {
	if len(dests) == 0 {
		return nil
	}
	set := slices.Clone(dests)
	slices.Sort(set)
	return slices.Compact(set)
}

// RowFilter is the WHERE clause of the publication of dests (Normalize'd, each a valid Kafka
// topic: letters, digits, '.', '_' and '-', which need no escaping in a string literal), or ""
// for every destination.
func RowFilter(dests []string) string {
	set := Normalize(dests)
	if len(set) == 0 {
		return ""
	}
	return " WHERE (destination IN ('" + strings.Join(set, "', '") + "'))"
}

// literal is a string literal of a deparsed row filter.
var literal = regexp.MustCompile(`'((?:[^']|'')*)'`)

// ParseRowFilter reads the destination set back from a publication's row filter as
// PostgreSQL deparses RowFilter's ("(destination = 'a'::text)", "(destination = ANY
// (ARRAY['a'::text, 'b'::text]))"): the string literals it holds, Normalize'd. "" (no filter)
// is nil: every destination.
func ParseRowFilter(filter string) []string {
	var set []string
	for _, m := range literal.FindAllStringSubmatch(filter, -1) {
		set = append(set, strings.ReplaceAll(m[1], "''", "'"))
	}
	return Normalize(set)
}

// Overlap returns the destinations that two sets both publish; nil (every destination) overlaps
// everything. It returns nil when they share none, and []string{"*"} when both are every
// destination.
func Overlap(a, b []string) []string {
	switch {
	case len(a) == 0 && len(b) == 0:
		return []string{"*"}
	case len(a) == 0:
		return Normalize(b)
	case len(b) == 0:
		return Normalize(a)
	}
	var both []string
	for _, d := range Normalize(a) {
		if slices.Contains(b, d) {
			both = append(both, d)
		}
	}
	return both
}

// validName is what a slot or publication name may be: PostgreSQL's slot-name rule (lower
// case letters, digits and underscores), so the name needs no quoting in the replication
// protocol's commands.
var validName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// ValidName reports whether name may name a slot or a publication.
func ValidName(name string) bool { return validName.MatchString(name) }
