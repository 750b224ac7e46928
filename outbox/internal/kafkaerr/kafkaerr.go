// Package kafkaerr classifies the errors of the relay's produce: whether the row is retried
// after a backoff using an attempt, deferred without one while Kafka is unavailable, or
// rejected at once because Kafka refuses the record for good (keiro §1.4 item 2).
package kafkaerr

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	sharedkafkaerr "github.com/keiro-go/keiro/internal/kafkaerr"
)

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
