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
	return topicSearch[Record]{
		who: who, topic: topic, noun: "record", count: want.Count, within: want.Within,
		want: c.describe(), headers: headers,
		empty: "did the relay run? keirotest.DrainOutbox runs one",
		read:  func(recs []*kgo.Record) []Record { return decodeAll(recs) },
		check: func(r Record) ([]string, bool) {
			if r.DecodeErr != nil {
				return []string{"not a keiro record: " + r.DecodeErr.Error()}, false
			}
			return c.mismatches(r.Event, ""), true
		},
		line:   func(r Record) string { return recordLine(r, len(headers) > 0) },
		record: func(r Record) *kgo.Record { return r.Record },
	}.require(t, kafka)
}

// topicSearch is what RequirePublished and RequireDeadLettered share: read a topic until
// count of its records match (any, when count is 0) or within has passed, then fail with every
// record on the topic and how each differs from what was wanted.
type topicSearch[T any] struct {
	who, topic string
	noun       string // what a matching record is called in the failure message
	count      int
	within     time.Duration
	want       string // the criteria, described
	headers    []HeaderMatcher
	empty      string // the hint when the topic has no records
	read       func([]*kgo.Record) []T
	// check says how one record differs from the criteria, before its headers; ok is false
	// when it is not a record of the kind searched for (its headers are not checked then).
	check  func(T) (diffs []string, ok bool)
	line   func(T) string
	record func(T) *kgo.Record
}

func (s topicSearch[T]) require(t testing.TB, kafka *Kafka) []T {
	t.Helper()
	deadline := time.Now().Add(s.within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		recs, err := kafka.ReadTopic(ctx, s.topic)
		cancel()
		if err != nil {
			t.Fatalf("%s: read topic %q: %v", s.who, s.topic, err)
		}
		all := s.read(recs)
		diffs := make([][]string, len(all))
		var matched []T
		for i, r := range all {
			d, ok := s.check(r)
			if diffs[i] = d; !ok {
				continue
			}
			if diffs[i] = append(d, headerMismatches(s.record(r).Headers, s.headers)...); len(diffs[i]) == 0 {
				matched = append(matched, r)
			}
		}
		if (s.count == 0 && len(matched) > 0) || (s.count > 0 && len(matched) == s.count) {
			return matched
		}
		if time.Now().Before(deadline) {
			time.Sleep(min(50*time.Millisecond, time.Until(deadline))) // Kafka offers no signal for "a record arrived"
			continue
		}
		head := "no " + s.noun + " matches"
		if s.count > 0 {
			head = fmt.Sprintf("want exactly %s matching, found %d", plural(s.count, s.noun), len(matched))
		}
		if s.within > 0 {
			head += fmt.Sprintf(" within %s", s.within)
		}
		var found string
		if len(all) == 0 {
			found = fmt.Sprintf("  found: topic %q has no records (%s)", s.topic, s.empty)
		} else {
			found = fmt.Sprintf("  found %s on topic %q:%s", plural(len(all), "record"), s.topic,
				listing(len(all), func(i int) string { return s.line(all[i]) }, func(i int) []string { return diffs[i] }))
		}
		desc := s.want
		if len(s.headers) > 0 {
			desc += ", " + describeHeaders(s.headers)
		}
		t.Fatalf("%s: %s on topic %q\n  want: %s\n%s", s.who, head, s.topic, desc, found)
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
