package kafkaerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TestRefusals: which produce errors refuse the record itself, which its topic, and which
// neither (an outage or another error).
func TestRefusals(t *testing.T) {
	for _, c := range []struct {
		err           error
		record, topic string
	}{
		{kerr.MessageTooLarge, "message_too_large", ""},
		{fmt.Errorf("%w (uncompressed_bytes=1000400)", kerr.MessageTooLarge), "message_too_large", ""}, // franz-go's size check
		{kerr.RecordListTooLarge, "record_list_too_large", ""},
		{kerr.InvalidRecord, "invalid_record", ""},
		{kerr.UnknownTopicOrPartition, "", "unknown_topic_or_partition"},
		{fmt.Errorf("produce: %w", kerr.TopicAuthorizationFailed), "", "topic_authorization_failed"},
		{kerr.ClusterAuthorizationFailed, "", "cluster_authorization_failed"},
		{kerr.NotLeaderForPartition, "", ""},
		{context.DeadlineExceeded, "", ""},
		{errors.New("something else"), "", ""},
	} {
		code, ok := RecordRefusal(c.err)
		require.Equal(t, c.record, code, "%v", c.err)
		require.Equal(t, c.record != "", ok, "%v", c.err)
		code, ok = TopicRefusal(c.err)
		require.Equal(t, c.topic, code, "%v", c.err)
		require.Equal(t, c.topic != "", ok, "%v", c.err)
	}
	require.Equal(t, "not_leader_for_partition", Code(kerr.NotLeaderForPartition))
	require.Empty(t, Code(errors.New("x")))
	require.True(t, IsRecordCode("corrupt_message"))
	require.False(t, IsRecordCode("topic_authorization_failed"))
}
