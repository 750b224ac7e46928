package outbox

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
		class errClass
		code  string
	}{
		{kerr.MessageTooLarge, classPermanent, "message_too_large"},
		{fmt.Errorf("produce: %w", kerr.RecordListTooLarge), classPermanent, "record_list_too_large"},
		{kerr.InvalidTopicException, classPermanent, "invalid_topic_exception"},
		{kerr.TopicAuthorizationFailed, classPermanent, "topic_authorization_failed"},
		{kerr.PolicyViolation, classPermanent, "policy_violation"},
		{kerr.UnknownTopicOrPartition, classTransient, ""}, // a topic created late must not lose rows
		{kerr.UnknownServerError, classTransient, ""},
		{kerr.ClusterAuthorizationFailed, classOutage, ""}, // the relay's credentials, not the row
		{kerr.NotLeaderForPartition, classOutage, ""},
		{kerr.RequestTimedOut, classOutage, ""},
		{kgo.ErrRecordTimeout, classOutage, ""},
		{kgo.ErrRecordRetries, classOutage, ""},
		{fmt.Errorf("read: %w", io.EOF), classOutage, ""},
		{context.DeadlineExceeded, classOutage, ""},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, classOutage, ""},
		{errors.New("something else"), classTransient, ""},
	} {
		class, code := classify(c.err)
		require.Equal(t, c.class, class, "%v", c.err)
		require.Equal(t, c.code, code, "%v", c.err)
	}
}
