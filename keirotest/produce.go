package keirotest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
)

// Produce writes ev to kafka as the relay would publish it: topic ev.Destination, key ev.Key,
// value ev.Payload, and the keiro headers of ev.Record (the relay's own encoding: the same
// headers in the same order). It returns the record with its partition and offset. It fails t
// when ev is not a valid event (the relay would never publish it) or Kafka refuses the record.
// To test a record that is not a keiro record, produce it with kafka.Client.
func Produce(t testing.TB, kafka *Kafka, ev envelope.Event) *kgo.Record {
	t.Helper()
	const who = "keirotest.Produce"
	if kafka == nil {
		t.Fatalf("%s: kafka is nil; pass the broker from keirotest.NewKafka", who)
	}
	if err := ev.Validate(); err != nil {
		t.Fatalf("%s: the event is not valid, so the relay would never publish it: %v "+
			"(produce records that are not keiro records with kafka.Client)", who, err)
	}
	r := ev.Record(envelope.EncodeOptions{})
	rec := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: make([]kgo.RecordHeader, len(r.Headers))}
	for i, h := range r.Headers {
		rec.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafka.Client.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatalf("%s: produce message %q to topic %q: %v", who, ev.MessageID, ev.Destination, err)
	}
	return rec
}
