// Package kafkaerr classifies the errors of the relay's produce: whether the row is retried
// after a backoff using an attempt, deferred without one while Kafka is unavailable, or
// rejected at once because Kafka refuses the record for good (keiro §1.4 item 2).
package kafkaerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	sharedkafkaerr "github.com/keiro-go/keiro/internal/kafkaerr"
)

// The rejection codes the relay gives itself, besides the Kafka error names Classify gives.
const (
	// CodeInvalidTopic rejects a record whose destination is not a legal Kafka topic name
	// (empty, longer than 249 characters, or of other characters than a-z A-Z 0-9 . _ -):
	// no produce can succeed, so it is not attempted (CheckTopic).
	CodeInvalidTopic = "invalid_topic"
	// CodeMessageTooLarge rejects a record larger than the relay's MaxRecordBytes before it
	// is sent, as Kafka's MESSAGE_TOO_LARGE would.
	CodeMessageTooLarge = "message_too_large"
	// CodeUnknownTopic rejects, in log mode, a record whose topic Kafka still did not know
	// after the producer's bounded wait for it (OfLogRecord).
	CodeUnknownTopic = "unknown_topic_or_partition"
	// CodeUndecodable rejects, in log mode, a row of keiro_outbox_log whose column values
	// do not make an event (an occurred_at of infinity, ...).
	CodeUndecodable = "undecodable_row"
	// CodeUndecodableMessage rejects, in log mode, an event written by Store.EmitTx (a logical
	// decoding message of the outbox's prefix) whose content does not decode: a format version
	// the relay does not know, a truncated content, or values that do not make an event.
	CodeUndecodableMessage = "undecodable_message"
)

// CheckTopic is the check both relay modes make of a record's destination where they build
// the record, before any produce: an illegal topic name is refused by the client ("no
// topic", for an empty one) or by Kafka on every attempt, so the row is rejected at once with
// CodeInvalidTopic and the reason, instead of using its attempts (claim mode) or ending the
// log-mode engine's session on every replay.
func CheckTopic(topic string) (code string, err error) {
	if err := envelope.ValidateTopic(topic); err != nil {
		return CodeInvalidTopic, fmt.Errorf("destination %q %w; correct the row's destination and requeue it", bounded(topic), err)
	}
	return "", nil
}

// bounded shortens a name for an error message.
func bounded(s string) string {
	const n = 300
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// Class is how the relay treats a produce error.
type Class int

const (
	// Transient: the row failed; it uses an attempt and is retried after backoff, and goes
	// dead when attempts are exhausted.
	Transient Class = iota
	// Outage: Kafka (or the path to it) is unavailable; the row is retried after a relay-wide
	// backoff WITHOUT using an attempt, so an outage never kills rows.
	Outage
	// Permanent: Kafka refuses this record for good; the row is rejected at once.
	Permanent
)

// permanentErrors are the broker errors that reject a record for good (keiro §1.4 item 2).
// UnknownTopicOrPartition is deliberately transient: a topic created late (or auto-created)
// must not lose rows; if it never appears, the row dies after its attempts and can be
// requeued. ClusterAuthorizationFailed is an outage: it concerns the relay's credentials, not
// the row, so rows wait (without using attempts) until the ACLs are fixed.
var permanentErrors = []*kerr.Error{
	kerr.MessageTooLarge,
	kerr.RecordListTooLarge,
	kerr.InvalidTopicException,
	kerr.TopicAuthorizationFailed,
	kerr.InvalidRecord,
	kerr.CorruptMessage,
	kerr.UnsupportedForMessageFormat,
	kerr.PolicyViolation,
}

// Classify maps a produce error to its class and, for permanent errors, the rejection code
// (the Kafka error name, lowercased).
func Classify(err error) (Class, string) {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		for _, p := range permanentErrors {
			if ke == p {
				return Permanent, strings.ToLower(ke.Message)
			}
		}
		switch {
		case ke == kerr.UnknownTopicOrPartition || ke == kerr.UnknownTopicID:
			return Transient, ""
		case ke == kerr.ClusterAuthorizationFailed || ke.Retriable:
			return Outage, ""
		}
		return Transient, ""
	}
	var ne net.Error
	switch {
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.As(err, &ne):
		return Outage, ""
	}
	return Transient, ""
}

// OfLogRecord is log mode's treatment of a produce error: Classify's, except that an unknown
// topic is permanent. The log-mode engine's producer retries every record without limit but
// for an unknown topic, which it waits for a bounded number of metadata refreshes
// (UnknownTopicRetries): an unknown-topic error that reaches the engine has used that bound,
// as a claim-mode row that dies after its attempts. The record is rejected with
// CodeUnknownTopic, and a requeue publishes it once the topic exists.
func OfLogRecord(err error) (Class, string) {
	class, code := Classify(err)
	if class != Permanent && (errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID)) {
		return Permanent, CodeUnknownTopic
	}
	return class, code
}

// Suspect reports a record Kafka refused for good with err in a request that held other
// records for its partition too (shared): the refusal may concern another record of the
// request (a poison record fails its bystanders), so the row is retried alone before it is
// rejected.
func Suspect(err error, shared bool) bool {
	if err == nil || !shared {
		return false
	}
	class, code := Classify(err)
	return isSuspect(shared, class, code)
}

// OfRecord is how the relay treats a record that failed with err: err's class, except that a
// suspect (see Suspect) is transient, retried alone. The produce and the mark must agree on
// it: a row that will be retried fails its group, so no later row of the group may go out
// after it.
func OfRecord(err error, shared bool) (Class, string) {
	class, code := Classify(err)
	if isSuspect(shared, class, code) {
		class = Transient
	}
	return class, code
}

func isSuspect(shared bool, class Class, code string) bool {
	// A rejection code that concerns one record, as opposed to its topic.
	return shared && class == Permanent && sharedkafkaerr.IsRecordCode(code)
}
