package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestConsumerShutdownDuringRebalance: SIGTERM must end the consumer within about its
// --shutdown-timeout even while the group is rebalancing after members died. (An unbounded
// kgo Client.Close, whose LeaveGroup waits for an in-flight JoinGroup, once held the process
// for franz-go's 60 s rebalance timeout; inbox.Consumer now bounds leaving and closing.)
func TestConsumerShutdownDuringRebalance(t *testing.T) {
	eachKafka(t, testConsumerShutdownDuringRebalance)
}

func testConsumerShutdownDuringRebalance(t *testing.T, kc *testenv.Kafka) {
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	topic, group := kc.Topic("e2e.shutdown.v1"), kc.Group("shutdown")
	kc.CreateTopic(t, topic, 6)
	env := consumerEnv(db, kc, group, topic, "KEIRO_CONSUMER_LOG_LEVEL=debug",
		"KEIRO_CONSUMER_SESSION_TIMEOUT="+chaosSessionTimeout.String(),
		"KEIRO_CONSUMER_REBALANCE_TIMEOUT="+chaosRebalanceTimeout.String())
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
