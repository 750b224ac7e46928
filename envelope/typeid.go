package envelope

import (
	"errors"
	"fmt"
)

// ErrInvalidTypeID reports a TypeID, or a TypeID prefix, that breaks the TypeID specification
// (version 0.3).
var ErrInvalidTypeID = errors.New("envelope: invalid TypeID")

// typeIDAlphabet is Crockford's base32 in lower case, as TypeID uses it.
const typeIDAlphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// typeIDSuffixLen is the length of a TypeID's suffix: 128 bits in 5-bit characters, the first
// holding the top 3.
const typeIDSuffixLen = 26

// NewTypeID returns a fresh TypeID: prefix, an underscore, and a new UUIDv7 (NewUUIDv7) in
// TypeID's base32, as keiro mints integration message ids ("msg_01h455vb4pex5vsknk084sn02q").
// TypeIDs of one process sort by creation time. An empty prefix gives the suffix alone.
func NewTypeID(prefix string) (string, error) {
	return FormatTypeID(prefix, NewUUIDv7())
}

// FormatTypeID returns the TypeID of id under prefix. The prefix is at most 63 lowercase latin
// letters and underscores, neither first nor last; an invalid one is an ErrInvalidTypeID.
func FormatTypeID(prefix string, id UUID) (string, error) {
	if err := validateTypeIDPrefix(prefix); err != nil {
		return "", err
	}
	out := make([]byte, 0, len(prefix)+1+typeIDSuffixLen)
	if prefix != "" {
		out = append(out, prefix...)
		out = append(out, '_')
	}
	hi, lo := uint64(0), uint64(0)
	for _, b := range id[:8] {
		hi = hi<<8 | uint64(b)
	}
	for _, b := range id[8:] {
		lo = lo<<8 | uint64(b)
	}
	for i := range typeIDSuffixLen {
		out = append(out, typeIDAlphabet[shr128(hi, lo, uint(125-5*i))&31])
	}
	return string(out), nil
}

// ParseTypeID splits a TypeID into its prefix and UUID. It accepts exactly what FormatTypeID
// produces: a valid prefix and an underscore (or neither), then 26 lowercase base32 characters
// whose first is at most '7'.
func ParseTypeID(s string) (prefix string, id UUID, err error) {
	if len(s) < typeIDSuffixLen {
		return "", UUID{}, fmt.Errorf("%w %q: shorter than its %d-character suffix", ErrInvalidTypeID, s, typeIDSuffixLen)
	}
	suffix := s[len(s)-typeIDSuffixLen:]
	if head := s[:len(s)-typeIDSuffixLen]; head != "" {
		if head[len(head)-1] != '_' || len(head) == 1 {
			return "", UUID{}, fmt.Errorf("%w %q: the prefix must end with an underscore before the suffix", ErrInvalidTypeID, s)
		}
		prefix = head[:len(head)-1]
		if err := validateTypeIDPrefix(prefix); err != nil {
			return "", UUID{}, err
		}
	}
	if suffix[0] > '7' {
		return "", UUID{}, fmt.Errorf("%w %q: the suffix overflows 128 bits", ErrInvalidTypeID, s)
	}
	var hi, lo uint64
	for i := range len(suffix) {
		v := typeIDValue(suffix[i])
		if v < 0 {
			return "", UUID{}, fmt.Errorf("%w %q: %q is not a base32 character", ErrInvalidTypeID, s, suffix[i])
		}
		hi = hi<<5 | lo>>59
		lo = lo<<5 | uint64(v)
	}
	for i := range 8 {
		id[i] = byte(hi >> (56 - 8*i))
		id[8+i] = byte(lo >> (56 - 8*i))
	}
	return prefix, id, nil
}

// shr128 returns the low 64 bits of the 128-bit value hi:lo shifted right by s (s < 128).
func shr128(hi, lo uint64, s uint) uint64 {
	if s >= 64 {
		return hi >> (s - 64)
	}
	return hi<<(64-s) | lo>>s
}

// typeIDValue is c's value in typeIDAlphabet, -1 when c is not in it.
func typeIDValue(c byte) int {
	for i := range len(typeIDAlphabet) {
		if typeIDAlphabet[i] == c {
			return i
		}
	}
	return -1
}

// validateTypeIDPrefix checks TypeID's prefix rule: at most 63 characters of a-z and '_', not
// starting or ending with '_'.
func validateTypeIDPrefix(prefix string) error {
	if len(prefix) > 63 {
		return fmt.Errorf("%w prefix %q: longer than 63 characters", ErrInvalidTypeID, prefix)
	}
	for i := range len(prefix) {
		c := prefix[i]
		if (c < 'a' || c > 'z') && c != '_' {
			return fmt.Errorf("%w prefix %q: use lowercase latin letters and underscores", ErrInvalidTypeID, prefix)
		}
	}
	if prefix != "" && (prefix[0] == '_' || prefix[len(prefix)-1] == '_') {
		return fmt.Errorf("%w prefix %q: it must not start or end with an underscore", ErrInvalidTypeID, prefix)
	}
	return nil
}
