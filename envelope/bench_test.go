package envelope_test

import (
	"strings"
	"testing"

	"github.com/keiro-go/keiro/envelope"
)

// Benchmarks for the codec's cost per record; the limits they sit next to are
// BenchmarkHeadersCopyOnly (copying 19 header values, the least an encoder can do) and
// BenchmarkDecodeLookupOnly is the floor for decoding: one pass over the headers that finds
// the 19 known names, and one copy of their values into a string, with no parsing.
func BenchmarkDecodeLookupOnly(b *testing.B) {
	r := recordOf(sample(b))
	known := make(map[string]int, len(envelope.HeaderNames))
	for i, n := range envelope.HeaderNames {
		known[n] = i
	}
	var sink string
	b.ReportAllocs()
	for b.Loop() {
		var pos [len(envelope.HeaderNames)]int
		n := 0
		for i, h := range r.Headers {
			if j, ok := known[h.Key]; ok && pos[j] == 0 {
				pos[j] = i + 1
				n += len(h.Value)
			}
		}
		var sb strings.Builder
		sb.Grow(n)
		for _, p := range pos {
			if p != 0 {
				sb.Write(r.Headers[p-1].Value)
			}
		}
		sink = sb.String()
	}
	_ = sink
}
