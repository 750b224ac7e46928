package envelope_test

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

// packHeaders serialises headers for the fuzzer: per header a 1-byte name length, the name,
// a 2-byte big-endian value length and the value.
func packHeaders(hs []envelope.Header) []byte {
	var b []byte
	for _, h := range hs {
		b = append(b, byte(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

// unpackHeaders is packHeaders' inverse; a truncated tail is dropped.
func unpackHeaders(b []byte) []envelope.Header {
	var hs []envelope.Header
	for len(b) > 0 {
		n := int(b[0])
		if len(b) < 1+n+2 {
			break
		}
		name := string(b[1 : 1+n])
		b = b[1+n:]
		m := int(binary.BigEndian.Uint16(b))
		b = b[2:]
		if len(b) < m {
			m = len(b)
		}
		hs = append(hs, envelope.Header{Key: name, Value: b[:m]})
		b = b[m:]
	}
	return hs
}

var fuzzTimestamp = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// FuzzDecode feeds arbitrary headers to Decode. It must never panic, must fail only with a
// *HeaderError, and whatever decodes must re-encode to a record that decodes to the same
// event, with or without the CloudEvents headers.
func FuzzDecode(f *testing.F) {
	s := sample(f)
	m := minimal()
	for _, e := range []envelope.Event{s, m} {
		f.Add(packHeaders(e.Headers()), e.Destination, []byte("k"), true, e.Payload)
		f.Add(packHeaders(e.AppendHeaders(nil, envelope.EncodeOptions{CloudEvents: true})), e.Destination, []byte(nil), false, []byte(nil))
	}
	ce := ceRecord()
	f.Add(packHeaders(ce.Headers), ce.Topic, ce.Key, true, ce.Value)
	broken := recordOf(s)
	f.Add(packHeaders(with(broken, "keiro-occurred-at", "2023-02-25T00:00:00.123456789012+05:30").Headers), "t", []byte{}, true, []byte{})
	f.Add(packHeaders(with(broken, "keiro-attributes", ` {"a" : [1, 2.50e3, "\u00e9"]} `).Headers), "t", []byte{}, false, []byte{})
	f.Add(packHeaders(with(broken, "keiro-schema-version", "+0042").Headers), "t", []byte{}, false, []byte{})
	f.Add(packHeaders(without(broken, "keiro-source").Headers), "t", []byte{}, false, []byte{})

	f.Fuzz(func(t *testing.T, packed []byte, topic string, key []byte, hasKey bool, value []byte) {
		rec := envelope.Record{Topic: topic, Value: value, Headers: unpackHeaders(packed), Timestamp: fuzzTimestamp}
		if hasKey {
			rec.Key = append([]byte{}, key...)
		}
		e, err := envelope.Decode(rec)
		if err != nil {
			var he *envelope.HeaderError
			if !errors.As(err, &he) {
				t.Fatalf("error %T is not a *HeaderError: %v", err, err)
			}
			if he.Kind < envelope.MissingHeader || he.Kind > envelope.InvalidJSONHeader || he.Header == "" {
				t.Fatalf("malformed HeaderError %+v", he)
			}
			if len(err.Error()) > 2*envelope.MaxErrorValueLen+200 {
				t.Fatalf("unbounded message (%d bytes)", len(err.Error()))
			}
			return
		}
		_ = e.Validate() // must not panic
		for _, opts := range []envelope.EncodeOptions{{}, {CloudEvents: true}} {
			r2 := e.Record(opts)
			r2.Timestamp = fuzzTimestamp
			again, err := envelope.Decode(r2)
			if err != nil {
				t.Fatalf("re-encoded event does not decode: %v\nevent %s", err, dump(e))
			}
			if !reflect.DeepEqual(again, e) {
				t.Fatalf("re-encoded event differs\nfirst  %s\nsecond %s", dump(e), dump(again))
			}
		}
	})
}
