// Package pgtext prepares outside text (error messages, broker replies) for PostgreSQL text
// columns, which refuse invalid UTF-8 and NUL bytes, and reads large bytea values in part
// (PrefixSQL) for listings.
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Storable makes s storable in a PostgreSQL text column: invalid UTF-8 and NUL bytes become
// U+FFFD, and the result is cut to at most max bytes on a character boundary. A raw byte cut
// could split a character, and PostgreSQL would then refuse the statement that stores it, on
// every retry.
func Storable(s string, max int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
