package main

import (
	"regexp"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The consumer hands its logger to franz-go: when the broker goes away, the client's
// connection failures appear in the consumer's log (component=kafka).
func TestConsumerLogsKafkaClientProblems(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	sqlFixture(t, db)
	kc := testenv.NewKafka(t)
	const topic = "kafkalog.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	env := preflightEnv(db, kc, topic)
	env = append(env, "KEIRO_CONSUMER_SQL_FUNCTION="+db.Schema+".apply_event")
	p := startBinary(t, env)
	p.waitLog(regexp.MustCompile(`msg=consuming`), 60*time.Second)
	kc.Cluster.Close() // the broker goes away
	p.waitLog(regexp.MustCompile(`level=(WARN|ERROR) .*component=kafka`), 60*time.Second)
	if code := p.stop(30 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM:\n%s", code, p.log())
	}
}
