package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestBackoffDelay: retry n waits uniformly in [d/2, d] with d = min(Max, Initial × 2^(n-1)),
// the jitter spreads over that range, and a huge n neither overflows nor exceeds Max.
func TestBackoffDelay(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2}
	for n, d := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 60: time.Second, 1 << 30: time.Second} {
		lo, hi := time.Duration(1<<62), time.Duration(0)
		for range 2000 {
			got := b.delay(n)
			require.GreaterOrEqual(t, got, d/2, "retry %d", n)
			require.LessOrEqual(t, got, d, "retry %d", n)
			lo, hi = min(lo, got), max(hi, got)
		}
		require.Less(t, lo, d*6/10, "retry %d: no jitter below", n)
		require.Greater(t, hi, d*9/10, "retry %d: no jitter above", n)
	}
}

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
