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
