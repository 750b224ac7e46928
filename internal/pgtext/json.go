package pgtext

import "bytes"

// JSONHasNUL reports whether the JSON text b escapes a NUL character, which PostgreSQL's jsonb
// refuses: a \u0000 whose backslash is not itself escaped (an odd run of backslashes before the
// u), so `\\u0000` is a backslash and text, not a NUL.
func JSONHasNUL(b []byte) bool {
	for i := 0; ; {
		j := bytes.Index(b[i:], []byte(`u0000`))
		if j < 0 {
			return false
		}
		k := i + j
		n := 0
		for p := k - 1; p >= 0 && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 1 {
			return true
		}
		i = k + 1
	}
}
