package keirotest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
)

// Published describes the records a test expects on a topic (RequirePublished). Empty fields
// match anything.
type Published struct {
	// MessageID is the event's message id. Defaults to any.
	MessageID string
	// Source is the producing bounded context. Defaults to any.
	Source string
	// Key is the record key. Defaults to any (keyed or not).
	Key string
	// NoKey requires a record without a key. Defaults to false.
	NoKey bool
	// EventType is the event type. Defaults to any.
	EventType string
	// Payload checks the record value (JSONSubset, JSONEqual, PayloadFunc, JSONFunc).
	// Defaults to any.
	Payload PayloadMatcher
	// Where is a last check of the decoded event; its error says what differs. Defaults to
	// none.
	Where func(envelope.Event) error
	// Count is the exact number of matching records wanted. Defaults to 0: at least one.
	Count int
	// Within is how long to wait for the records to appear (for a relay running in the
	// background). Defaults to 0: only the records on the topic when RequirePublished is
	// called count (after DrainOutbox they are all there).
	Within time.Duration
}

// Record is a record read from Kafka with its keiro envelope decoded.
type Record struct {
	// Record is the Kafka record.
	Record *kgo.Record
	// Event is the decoded envelope (headers, key and value).
	Event envelope.Event
	// DecodeErr is why the record is not a keiro record (its Event is then empty), else nil.
	DecodeErr error
}

// PublishedRecords returns every record on topic (as Kafka.Records) with its keiro envelope
// decoded.
func PublishedRecords(t testing.TB, kafka *Kafka, topic string) []Record {
	t.Helper()
	return decodeAll(kafka.Records(t, topic))
}

func decodeAll(recs []*kgo.Record) []Record {
	out := make([]Record, len(recs))
	for i, r := range recs {
		hs := make([]envelope.Header, len(r.Headers))
		for j, h := range r.Headers {
			hs[j] = envelope.Header{Key: h.Key, Value: h.Value}
		}
		ev, err := envelope.Decode(envelope.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp})
		out[i] = Record{Record: r, Event: ev, DecodeErr: err}
	}
	return out
}

// RequirePublished fails t unless topic holds a keiro record matching want and every one of
// headers (exactly want.Count of them when it is set), and returns the matching records in
// partition and offset order. headers check the record's Kafka headers as they are on the
// topic: WithCorrelationID, WithTraceParent, WithTraceID, WithSchemaID, WithHeader,
// WithoutHeader. The failure message lists every record on the topic (records that are not
// keiro records with the reason; with header matchers, every record's headers too) and how
// each differs from want.
func RequirePublished(t testing.TB, kafka *Kafka, topic string, want Published, headers ...HeaderMatcher) []Record {
	t.Helper()
	const who = "keirotest.RequirePublished"
	if kafka == nil {
		t.Fatalf("%s: kafka is nil; pass the broker from keirotest.NewKafka", who)
	}
	if want.Count < 0 || want.Within < 0 {
		t.Fatalf("%s: Published.Count and Within must not be negative, got %d and %s", who, want.Count, want.Within)
	}
	if err := checkHeaderMatchers(headers); err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	c := criteria{messageID: want.MessageID, source: want.Source, key: want.Key, noKey: want.NoKey,
		eventType: want.EventType, payload: want.Payload, where: want.Where}
	deadline := time.Now().Add(want.Within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		recs, err := kafka.ReadTopic(ctx, topic)
		cancel()
		if err != nil {
			t.Fatalf("%s: read topic %q: %v", who, topic, err)
		}
		all := decodeAll(recs)
		diffs := make([][]string, len(all))
		var matched []Record
		for i, r := range all {
			if r.DecodeErr != nil {
				diffs[i] = []string{"not a keiro record: " + r.DecodeErr.Error()}
				continue
			}
			diffs[i] = append(c.mismatches(r.Event, ""), headerMismatches(r.Record.Headers, headers)...)
			if len(diffs[i]) == 0 {
				matched = append(matched, r)
			}
		}
		if (want.Count == 0 && len(matched) > 0) || (want.Count > 0 && len(matched) == want.Count) {
			return matched
		}
		if time.Now().Before(deadline) {
			time.Sleep(min(50*time.Millisecond, time.Until(deadline))) // Kafka offers no signal for "a record arrived"
			continue
		}
		head := "no record matches"
		if want.Count > 0 {
			head = fmt.Sprintf("want exactly %s matching, found %d", plural(want.Count, "record"), len(matched))
		}
		var found string
		if len(all) == 0 {
			found = fmt.Sprintf("  found: topic %q has no records (did the relay run? keirotest.DrainOutbox runs one)", topic)
		} else {
			found = fmt.Sprintf("  found %s on topic %q:%s", plural(len(all), "record"), topic,
				listing(len(all), func(i int) string { return recordLine(all[i], len(headers) > 0) },
					func(i int) []string { return diffs[i] }))
		}
		if want.Within > 0 {
			head += fmt.Sprintf(" within %s", want.Within)
		}
		desc := c.describe()
		if len(headers) > 0 {
			desc += ", " + describeHeaders(headers)
		}
		t.Fatalf("%s: %s on topic %q\n  want: %s\n%s", who, head, topic, desc, found)
		return nil
	}
}

// recordLine renders a record for a failure message, with its headers when withHeaders is
// set.
func recordLine(r Record, withHeaders bool) string {
	pos := fmt.Sprintf("partition %d offset %d", r.Record.Partition, r.Record.Offset)
	s := pos + ": " + summary(r.Event)
	if r.DecodeErr != nil {
		s = fmt.Sprintf("%s: key %q, value %s", pos, r.Record.Key, showPayload(r.Record.Value))
	}
	if withHeaders {
		s += "\n       headers: " + showHeaders(r.Record.Headers)
	}
	return s
}
