package envelope_test

import (
	"strings"
	"testing"

	"github.com/keiro-go/keiro/envelope"
)

// Benchmarks for the codec's cost per record, each next to its floor measured in the same run:
// BenchmarkHeadersCopyOnly (copying 19 encoded header values, the least an encoder can do) and
// BenchmarkDecodeLookupOnly (finding the 19 headers and copying their values once, the least a
// decoder can do). Run: go test -run='^$' -bench=. -benchmem ./envelope

func BenchmarkEncode(b *testing.B) {
	for _, c := range []struct {
		name string
		e    envelope.Event
	}{{"full", sample(b)}, {"minimal", minimal()}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]envelope.Header, 0, 32)
			for b.Loop() {
				dst = c.e.AppendHeaders(dst[:0], envelope.EncodeOptions{})
			}
		})
	}
	b.Run("full+cloudevents", func(b *testing.B) {
		e := sample(b)
		b.ReportAllocs()
		for b.Loop() {
			_ = e.Record(envelope.EncodeOptions{CloudEvents: true})
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	for _, c := range []struct {
		name string
		r    envelope.Record
	}{{"full", recordOf(sample(b))}, {"minimal", recordOf(minimal())}, {"cloudevents", ceRecord()}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := envelope.Decode(c.r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHeadersCopyOnly is the floor for encoding: copy the already-encoded header values
// of the full sample into one fresh buffer.
func BenchmarkHeadersCopyOnly(b *testing.B) {
	s := sample(b)
	src := s.Headers()
	dst := make([]envelope.Header, len(src))
	b.ReportAllocs()
	for b.Loop() {
		buf := make([]byte, 0, 512)
		for i, h := range src {
			start := len(buf)
			buf = append(buf, h.Value...)
			dst[i] = envelope.Header{Key: h.Key, Value: buf[start:len(buf):len(buf)]}
		}
	}
}

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
