package envelope_test

import (
	"testing"

	"github.com/keiro-go/keiro/envelope"
)

// Benchmarks for the codec's cost per record; the limits they sit next to are
// BenchmarkHeadersCopyOnly (copying 19 header values, the least an encoder can do) and
// BenchmarkDecodeLookupOnly (finding the 19 headers, the least a decoder can do).

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
// of the full sample into fresh byte slices.
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

// BenchmarkDecodeLookupOnly is the floor for decoding: find the 19 known headers by name and
// convert their values to strings, with no parsing.
func BenchmarkDecodeLookupOnly(b *testing.B) {
	r := recordOf(sample(b))
	var sink [19]string
	b.ReportAllocs()
	for b.Loop() {
		for i, name := range envelope.HeaderNames {
			for _, h := range r.Headers {
				if h.Key == name {
					sink[i] = string(h.Value)
					break
				}
			}
		}
	}
	_ = sink
}
