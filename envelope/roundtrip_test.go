package envelope_test

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

// genEvent draws an event with every field independently present or absent and arbitrary
// (not necessarily valid UTF-8) text, covering the whole representable domain of the codec.
func genEvent(r *rand.Rand) envelope.Event {
	str := func() string {
		alphabets := []string{"abcXYZ019._-", "héllo wörld ✓ ; = , \"", "\x00\x01\xff\xfe\n\t "}
		a := alphabets[r.IntN(len(alphabets))]
		b := make([]byte, r.IntN(24))
		for i := range b {
			b[i] = a[r.IntN(len(a))]
		}
		return string(b)
	}
	maybe := func() bool { return r.IntN(2) == 0 }
	i64 := func() int64 {
		switch r.IntN(4) {
		case 0:
			return 0
		case 1:
			return r.Int64N(100) - 50
		case 2:
			return int64(r.Uint64())
		}
		return []int64{-1 << 63, 1<<63 - 1}[r.IntN(2)]
	}
	uuid := func() *envelope.UUID {
		var u envelope.UUID
		for i := range u {
			u[i] = byte(r.UintN(256))
		}
		return &u
	}
	e := envelope.Event{
		MessageID:     str(),
		Source:        str(),
		Destination:   str(),
		EventType:     str(),
		SchemaVersion: i64(),
		ContentType:   str(),
		OccurredAt: time.Date(r.IntN(10000), time.Month(1+r.IntN(12)), 1+r.IntN(28),
			r.IntN(24), r.IntN(60), r.IntN(60), []int{0, r.IntN(1e9), r.IntN(1000) * 1e6}[r.IntN(3)], time.UTC),
	}
	if maybe() {
		e.Key = ptr(str())
	}
	if maybe() {
		e.Payload = []byte(str())
	}
	if maybe() {
		var ref envelope.SchemaRef
		if maybe() {
			ref.Registry = ptr(str())
		}
		if maybe() {
			ref.Subject = ptr(str())
		}
		if maybe() {
			ref.Version = ptr(i64())
		}
		if maybe() {
			ref.SchemaID = ptr(i64())
		}
		if maybe() {
			ref.Fingerprint = ptr(str())
		}
		if ref != (envelope.SchemaRef{}) {
			e.SchemaRef = &ref
		}
	}
	if maybe() {
		e.SourceEventID = uuid()
	}
	if maybe() {
		e.SourceGlobalPosition = ptr(i64())
	}
	if maybe() {
		e.CausationID = uuid()
	}
	if maybe() {
		e.CorrelationID = uuid()
	}
	if maybe() {
		e.TraceContext = &envelope.TraceContext{Traceparent: str()}
		if maybe() {
			e.TraceContext.Tracestate = str() + "x" // non-empty: empty means absent
		}
	}
	if maybe() {
		var v any
		switch r.IntN(5) {
		case 0:
			v = nil
		case 1:
			v = map[string]any{str(): str(), "n": r.Float64(), "b": maybe()}
		case 2:
			v = []any{i64(), str(), nil}
		case 3:
			v = str()
		default:
			v = r.IntN(1000)
		}
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		e.Attributes = b
	}
	return e
}

// TestRoundTripProperty checks Decode(Encode(e)) == e over seeded random events, with and
// without the CloudEvents profile.
func TestRoundTripProperty(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 2000
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		e := genEvent(r)
		opts := envelope.EncodeOptions{CloudEvents: i%2 == 1}
		rec := e.Record(opts)
		rec.Timestamp = time.Unix(1, 0)
		got, err := envelope.Decode(rec)
		if err != nil {
			t.Fatalf("case %d: Decode(Encode(%s)): %v", i, dump(e), err)
		}
		assertEqual(t, got, e)
	}
}
