// Package kafkaerr names the ways Kafka refuses a produce that every producer of keiro tells
// apart the same way: a refusal of the record itself (its size or content), which will recur
// for the same record, and a refusal of the topic (missing, not authorised), which will recur
// for every record sent there until an operator acts. The relay (outbox) and the consumer's
// dead-letter produce build their policies on it.
package kafkaerr

import (
	"errors"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
)

// recordErrors are the refusals that concern the record: Kafka would refuse it again,
// whatever the state of the cluster. franz-go fails a record larger than the client's
// ProducerBatchMaxBytes with kerr.MessageTooLarge before sending it, as the broker does for
// one above the topic's max.message.bytes.
var recordErrors = []*kerr.Error{
	kerr.MessageTooLarge,
	kerr.RecordListTooLarge,
	kerr.InvalidRecord,
	kerr.CorruptMessage,
}

// topicErrors are the refusals that concern the topic the record is sent to, or the
// producer's right to write it: every record sent there fails the same way until the topic
// is created or the ACLs are fixed. UnknownTopicOrPartition reaches the caller only after the
// client's own retries (kgo.UnknownTopicRetries).
var topicErrors = []*kerr.Error{
	kerr.UnknownTopicOrPartition,
	kerr.UnknownTopicID,
	kerr.TopicAuthorizationFailed,
	kerr.ClusterAuthorizationFailed,
}

// Code is the name of err's Kafka error, lowercased (message_too_large), or "" when err is not
// a Kafka error.
func Code(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return strings.ToLower(ke.Message)
	}
	return ""
}

// RecordRefusal reports whether err refuses the record itself (too large, invalid), with the
// error's code: producing the same bytes again fails again.
func RecordRefusal(err error) (string, bool) { return match(err, recordErrors) }

// TopicRefusal reports whether err refuses the topic (it does not exist, or the producer may
// not write it), with the error's code: every record sent there fails until an operator
// creates the topic or grants the producer WRITE.
func TopicRefusal(err error) (string, bool) { return match(err, topicErrors) }

// IsRecordCode reports whether code (as Code returns it) is the code of a record refusal.
func IsRecordCode(code string) bool {
	for _, e := range recordErrors {
		if strings.ToLower(e.Message) == code {
			return true
		}
	}
	return false
}

func match(err error, set []*kerr.Error) (string, bool) {
	var ke *kerr.Error
	if !errors.As(err, &ke) {
		return "", false
	}
	for _, e := range set {
		if ke == e {
			return strings.ToLower(ke.Message), true
		}
	}
	return "", false
}

// DefaultMaxRecordBytes is franz-go's default ProducerBatchMaxBytes: the largest record a client
// built without that option sends at all (a larger one fails before it is sent, as too large).
const DefaultMaxRecordBytes = 1_000_012
