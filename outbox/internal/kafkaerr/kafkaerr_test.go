package kafkaerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestClassify: which produce errors reject a row, which use an attempt and which are an
// outage (no attempt used).
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err   error
		class Class
		code  string
	}{
		{kerr.MessageTooLarge, Permanent, "message_too_large"},
		{fmt.Errorf("produce: %w", kerr.RecordListTooLarge), Permanent, "record_list_too_large"},
		{kerr.InvalidTopicException, Permanent, "invalid_topic_exception"},
		{kerr.TopicAuthorizationFailed, Permanent, "topic_authorization_failed"},
		{kerr.PolicyViolation, Permanent, "policy_violation"},
		{kerr.UnknownTopicOrPartition, Transient, ""}, // a topic created late must not lose rows
		{kerr.UnknownServerError, Transient, ""},
		{kerr.ClusterAuthorizationFailed, Outage, ""}, // the relay's credentials, not the row
		{kerr.NotLeaderForPartition, Outage, ""},
		{kerr.RequestTimedOut, Outage, ""},
		{kgo.ErrRecordTimeout, Outage, ""},
		{kgo.ErrRecordRetries, Outage, ""},
		{fmt.Errorf("read: %w", io.EOF), Outage, ""},
		{context.DeadlineExceeded, Outage, ""},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, Outage, ""},
		{errors.New("something else"), Transient, ""},
	} {
		class, code := Classify(c.err)
		require.Equal(t, c.class, class, "%v", c.err)
		require.Equal(t, c.code, code, "%v", c.err)
	}
}

// TestOfRecord: a record-level refusal in a request shared with other records is a suspect,
// retried alone (transient); alone, or of the topic, it rejects the row.
func TestOfRecord(t *testing.T) {
	for _, c := range []struct {
		err     error
		shared  bool
		class   Class
		suspect bool
	}{
		{kerr.MessageTooLarge, true, Transient, true},
		{kerr.MessageTooLarge, false, Permanent, false},
		{kerr.CorruptMessage, true, Transient, true},
		{kerr.TopicAuthorizationFailed, true, Permanent, false}, // the topic's, not the record's
		{kerr.NotLeaderForPartition, true, Outage, false},
		{nil, true, Transient, false},
	} {
		class, _ := OfRecord(c.err, c.shared)
		require.Equal(t, c.class, class, "%v shared=%v", c.err, c.shared)
		require.Equal(t, c.suspect, Suspect(c.err, c.shared), "%v shared=%v", c.err, c.shared)
	}
}

// TestCheckTopic: a destination that is not a legal topic is rejected before any produce,
// with CodeInvalidTopic and a reason naming it.
func TestCheckTopic(t *testing.T) {
	for _, topic := range []string{"", "bad topic!", ".", "..", "a\nb", string(make([]byte, 250))} {
		code, err := CheckTopic(topic)
		require.Equal(t, CodeInvalidTopic, code, "%q", topic)
		require.ErrorContains(t, err, "destination", "%q", topic)
	}
	for _, topic := range []string{"orders", "a.b_c-1"} {
		code, err := CheckTopic(topic)
		require.NoError(t, err)
		require.Empty(t, code)
	}
}

// TestOfLogRecord: in log mode an unknown topic that reached the engine used its bounded wait
// and rejects the record; everything else is classified as in claim mode.
func TestOfLogRecord(t *testing.T) {
	for _, c := range []struct {
		err   error
		class Class
		code  string
	}{
		{kerr.UnknownTopicOrPartition, Permanent, CodeUnknownTopic},
		{fmt.Errorf("no partitions: %w", kerr.UnknownTopicOrPartition), Permanent, CodeUnknownTopic},
		{kerr.UnknownTopicID, Permanent, CodeUnknownTopic},
		{kerr.MessageTooLarge, Permanent, "message_too_large"},
		{kerr.NotLeaderForPartition, Outage, ""},
		{errors.New("something else"), Transient, ""},
	} {
		class, code := OfLogRecord(c.err)
		require.Equal(t, c.class, class, "%v", c.err)
		require.Equal(t, c.code, code, "%v", c.err)
	}
}
