package inbox

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
)

// FuzzRecordToDelivery feeds arbitrary header values and record bytes through the consumer's
// intake (kgo record → envelope.Decode → every dedupe policy → the row binding) and checks it
// never panics and binds exactly one row per accepted record.
func FuzzRecordToDelivery(f *testing.F) {
	good := envelope.Event{
		MessageID: "m-1", Source: "ordering", Destination: "billing.orders.v1", EventType: "OrderPlaced",
		SchemaVersion: 1, ContentType: envelope.ContentTypeJSON, Payload: []byte(`{"a":1}`),
		OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Attributes: []byte(`{"t":1}`),
	}
	var seed [][]byte
	for _, h := range good.Headers() {
		seed = append(seed, h.Value)
	}
	f.Add(bytes.Join(seed, []byte{0}), []byte("key"), []byte(`{"a":1}`), int64(17))
	f.Add([]byte("\x00\x00\x00"), []byte(nil), []byte(nil), int64(-1))
	f.Add([]byte("m\x00s\x00d\x00t\x00not-int\x00application/json"), []byte("k"), []byte("v"), int64(0))
	f.Fuzz(func(t *testing.T, values, key, value []byte, offset int64) {
		parts := bytes.Split(values, []byte{0})
		r := &kgo.Record{Topic: "t", Partition: 1, Offset: offset, Key: key, Value: value, Timestamp: time.Unix(0, 0)}
		for i, name := range envelope.HeaderNames {
			if i < len(parts) && len(parts[i]) > 0 {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: name, Value: parts[i]})
			}
		}
		ev, err := envelope.Decode(toEnvelopeRecord(r))
		if err != nil {
			return
		}
		d := Delivery{Event: ev, Kafka: &KafkaRef{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}}
		for _, p := range []DedupePolicy{DedupeMessageID, DedupeSourceEventIdentity, DedupeKafkaDelivery} {
			k1, err1 := p.Key(d)
			k2, err2 := p.Key(d)
			if k1 != k2 || (err1 == nil) != (err2 == nil) {
				t.Fatalf("policy %s is not deterministic", p)
			}
			if err1 == nil && k1 == "" {
				t.Fatalf("policy %s returned an empty key without an error", p)
			}
		}
		cols := newRowColumns(1)
		cols.add(ev.Source, "k", &d, true)
		cols.add(ev.Source, "k", &d, false)
		for i, a := range cols.args() {
			if n := lenOf(a); n != 2 {
				t.Fatalf("column %d bound %d values, want 2", i, n)
			}
		}
	})
}

func lenOf(a any) int { return reflect.ValueOf(a).Len() }
