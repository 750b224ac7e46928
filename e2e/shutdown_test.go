package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/internal/testdb"
	"github.com/keiro-go/keiro/internal/testkafka"
)

// TestConsumerShutdownDuringRebalance: SIGTERM must end the consumer within about its
// --shutdown-timeout even while the group is rebalancing after members died. (An unbounded
// kgo Client.Close, whose LeaveGroup waits for an in-flight JoinGroup, once held the process
// for franz-go's 60 s rebalance timeout; inbox.Consumer now bounds leaving and closing.)
func TestConsumerShutdownDuringRebalance(t *testing.T) {
	db := testdb.New(t)
	effectsFixture(t, db)
	kc := testkafka.New(t)
	const topic, group = "e2e.shutdown.v1", "shutdown"
	kc.CreateTopic(t, topic, 6)
	kc.ControlKey(int16(kmsg.JoinGroup), func(r kmsg.Request) (kmsg.Response, error, bool) {
		if jr, ok := r.(*kmsg.JoinGroupRequest); ok {
			jr.SessionTimeoutMillis = int32(chaosSessionTimeout.Milliseconds())
			jr.RebalanceTimeoutMillis = int32(chaosRebalanceTimeout.Milliseconds())
		}
		return nil, nil, false
	})
	env := consumerEnv(db, kc, group, topic, "KEIRO_CONSUMER_LOG_LEVEL=debug")
	a := startProc(t, "a", consumerBin, consumerAddrRe, env)
	a.waitAddr(t, 30*time.Second)
	for i := range 6 {
		b := startProc(t, fmt.Sprintf("b%d", i), consumerBin, consumerAddrRe, env)
		b.waitAddr(t, 30*time.Second)
		// Not synchronisation: the pauses place the next signal at different points of the
		// broker's session-timeout timeline of the member killed before (no signal marks them).
		time.Sleep(time.Duration(i) * 300 * time.Millisecond)
		if i%2 == 0 {
			b.kill() // a dead member the group must time out
			continue
		}
		t0 := time.Now()
		require.Equal(t, 0, b.term(t, 90*time.Second))
		require.Less(t, time.Since(t0), 15*time.Second, "b%d exit after SIGTERM (--shutdown-timeout=5s)", i)
	}
	t0 := time.Now()
	require.Equal(t, 0, a.term(t, 90*time.Second))
	require.Less(t, time.Since(t0), 15*time.Second, "exit after SIGTERM (--shutdown-timeout=5s)")
}
