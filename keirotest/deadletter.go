package keirotest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// deadLetterReasons are the values of the keiro-dlq-reason header the consumer writes.
var deadLetterReasons = []string{inbox.ReasonDecode, inbox.ReasonSchema, inbox.ReasonDedupe, inbox.ReasonPoisoned,
	inbox.ReasonPermanent, inbox.ReasonUnstorable}

// DeadLettered describes the records a test expects on a dead-letter topic
// (RequireDeadLettered). Empty fields match anything.
type DeadLettered struct {
	// MessageID is the message id of the dead-lettered record (its keiro-message-id header).
	// Defaults to any.
	MessageID string
	// Reason is why the consumer dead-lettered it: one of inbox.ReasonDecode, ReasonSchema,
	// ReasonDedupe, ReasonPoisoned, ReasonPermanent or ReasonUnstorable; any other value fails
	// the test. Defaults to any.
	Reason string
	// Error is text the consumer's error header must contain (the handler's or decoder's
	// error). Defaults to any.
	Error string
	// Attempts is the failed-attempt count the consumer recorded. Defaults to 0: any.
	Attempts int
	// SourceTopic is the topic the record was read from. Defaults to any.
	SourceTopic string
	// Consumer is the inbox consumer that dead-lettered it. Defaults to any.
	Consumer string
	// Count is the exact number of matching records wanted. Defaults to 0: at least one.
	Count int
	// Within is how long to wait for the records to appear (for a consumer running in the
	// background). Defaults to 0: only the records on the topic when RequireDeadLettered is
	// called count (after Consumer.WaitDeadLettered the record is there).
	Within time.Duration
}

// DeadLetterRecord is a record read from a dead-letter topic: the original record's key, value
// and headers, the consumer's dead-letter headers decoded, and the keiro envelope.
type DeadLetterRecord struct {
	// Record is the record on the dead-letter topic.
	Record *kgo.Record
	// Reason is the keiro-dlq-reason header (an inbox.Reason constant).
	Reason string
	// Error is the keiro-dlq-error header: the error that poisoned the record.
	Error string
	// Attempts is the keiro-dlq-attempts header: the failed attempts recorded (0 for records
	// dead-lettered before their handler ran).
	Attempts int
	// SourceTopic, SourcePartition and SourceOffset are where the record was read from
	// (keiro-dlq-topic, -partition, -offset).
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	// Consumer is the keiro-dlq-consumer header: the inbox consumer that dead-lettered it.
	Consumer string
	// At is the keiro-dlq-at header: when it was dead-lettered.
	At time.Time
	// Event is the keiro envelope of the original record; empty when DecodeErr is set.
	Event envelope.Event
	// DecodeErr is why the original record is not a keiro record (reason "decode"), else nil.
	DecodeErr error
}

// decodeDeadLetter reads the dead-letter headers of r; its Reason is empty when r has no
// keiro-dlq-reason header (it is not a dead letter of the consumer).
func decodeDeadLetter(r *kgo.Record) DeadLetterRecord {
	d := DeadLetterRecord{Record: r}
	original := make([]envelope.Header, 0, len(r.Headers))
	for _, h := range r.Headers {
		v := string(h.Value)
		switch h.Key {
		case inbox.HeaderDLQReason:
			d.Reason = v
		case inbox.HeaderDLQError:
			d.Error = v
		case inbox.HeaderDLQAttempts:
			d.Attempts, _ = strconv.Atoi(v)
		case inbox.HeaderDLQTopic:
			d.SourceTopic = v
		case inbox.HeaderDLQPartition:
			p, _ := strconv.ParseInt(v, 10, 32)
			d.SourcePartition = int32(p)
		case inbox.HeaderDLQOffset:
			d.SourceOffset, _ = strconv.ParseInt(v, 10, 64)
		case inbox.HeaderDLQConsumer:
			d.Consumer = v
		case inbox.HeaderDLQAt:
			d.At, _ = time.Parse(time.RFC3339Nano, v)
		default:
			original = append(original, envelope.Header{Key: h.Key, Value: h.Value})
		}
	}
	d.Event, d.DecodeErr = envelope.Decode(envelope.Record{Topic: d.SourceTopic, Partition: d.SourcePartition,
		Offset: d.SourceOffset, Key: r.Key, Value: r.Value, Headers: original, Timestamp: r.Timestamp})
	return d
}

// messageID is the record's message id, from its envelope or, for an undecodable record, its
// header.
func (d DeadLetterRecord) messageID() string {
	if d.DecodeErr == nil {
		return d.Event.MessageID
	}
	id, _ := lastHeader(d.Record.Headers, envelope.HeaderMessageID)
	return id
}

func (d DeadLetterRecord) String() string {
	s := fmt.Sprintf("partition %d offset %d: reason %q", d.Record.Partition, d.Record.Offset, d.Reason)
	if d.Attempts > 0 {
		s += fmt.Sprintf(" after %s", plural(d.Attempts, "attempt"))
	}
	s += fmt.Sprintf(", from %s partition %d offset %d by consumer %q", d.SourceTopic, d.SourcePartition, d.SourceOffset,
		d.Consumer)
	if d.DecodeErr != nil {
		s += fmt.Sprintf(", not a keiro record (%v): key %q, value %s", d.DecodeErr, d.Record.Key, showPayload(d.Record.Value))
	} else {
		s += ", " + summary(d.Event)
	}
	if d.Error != "" {
		s += ", error: " + clip(d.Error, 200)
	}
	return s
}

// mismatches lists how d differs from want; none means a match.
func (want DeadLettered) mismatches(d DeadLetterRecord) []string {
	var out []string
	field := func(name, want, got string) {
		if want != "" && want != got {
			out = append(out, fmt.Sprintf("%s is %q, want %q", name, got, want))
		}
	}
	field("message id", want.MessageID, d.messageID())
	field("reason", want.Reason, d.Reason)
	if want.Error != "" && !strings.Contains(d.Error, want.Error) {
		out = append(out, fmt.Sprintf("error is %q, want one containing %q", clip(d.Error, 200), want.Error))
	}
	if want.Attempts != 0 && want.Attempts != d.Attempts {
		out = append(out, fmt.Sprintf("attempts are %d, want %d", d.Attempts, want.Attempts))
	}
	field("source topic", want.SourceTopic, d.SourceTopic)
	field("consumer", want.Consumer, d.Consumer)
	return out
}

func (want DeadLettered) describe() string {
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, name+" "+strconv.Quote(v))
		}
	}
	add("message id", want.MessageID)
	add("reason", want.Reason)
	add("error containing", want.Error)
	if want.Attempts != 0 {
		parts = append(parts, plural(want.Attempts, "attempt"))
	}
	add("source topic", want.SourceTopic)
	add("consumer", want.Consumer)
	if len(parts) == 0 {
		return "any dead letter"
	}
	return strings.Join(parts, ", ")
}

// RequireDeadLettered fails t unless the dead-letter topic topic (the consumer's
// ConsumerConfig.DeadLetterTopic for the source topic: "<topic>.dlq" by default) holds a
// record the consumer dead-lettered matching want and every one of headers (exactly want.Count
// of them when it is set), and returns the matching records in partition and offset order,
// their dead-letter headers decoded. headers check the record's Kafka headers as for
// RequirePublished (the original record's headers are kept on the dead letter). The failure
// message lists every record on the topic with its reason and error (with header matchers, its
// headers too) and how each differs from want.
func RequireDeadLettered(t testing.TB, kafka *Kafka, topic string, want DeadLettered, headers ...HeaderMatcher) []DeadLetterRecord {
	t.Helper()
	const who = "keirotest.RequireDeadLettered"
	if kafka == nil {
		t.Fatalf("%s: kafka is nil; pass the broker from keirotest.NewKafka", who)
	}
	if want.Count < 0 || want.Within < 0 || want.Attempts < 0 {
		t.Fatalf("%s: DeadLettered.Count, Attempts and Within must not be negative, got %d, %d and %s", who, want.Count,
			want.Attempts, want.Within)
	}
	if want.Reason != "" && !slices.Contains(deadLetterReasons, want.Reason) {
		t.Fatalf("%s: unknown DeadLettered.Reason %q: use inbox.ReasonDecode, ReasonSchema, ReasonDedupe, ReasonPoisoned, "+
			"ReasonPermanent or ReasonUnstorable", who, want.Reason)
	}
	if err := checkHeaderMatchers(headers); err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	return topicSearch[DeadLetterRecord]{
		who: who, topic: topic, noun: "dead letter", count: want.Count, within: want.Within,
		want: want.describe(), headers: headers,
		empty: "is it the consumer's dead-letter topic? did the consumer run, and did Consumer.WaitDeadLettered return?",
		read: func(recs []*kgo.Record) []DeadLetterRecord {
			all := make([]DeadLetterRecord, len(recs))
			for i, r := range recs {
				all[i] = decodeDeadLetter(r)
			}
			return all
		},
		check: func(d DeadLetterRecord) ([]string, bool) {
			if d.Reason == "" {
				return []string{"not a dead letter: it has no " + inbox.HeaderDLQReason + " header"}, false
			}
			return want.mismatches(d), true
		},
		line: func(d DeadLetterRecord) string {
			if len(headers) > 0 {
				return d.String() + "\n       headers: " + showHeaders(d.Record.Headers)
			}
			return d.String()
		},
		record: func(d DeadLetterRecord) *kgo.Record { return d.Record },
	}.require(t, kafka)
}
