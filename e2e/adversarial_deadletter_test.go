package e2e

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// Dead-letter produces that fail: a dead letter Kafka refuses as too large, a dead-letter topic
// that does not exist, a dead-letter topic the consumer may not write. A dead letter too large
// for Kafka is that record's failure: it is dead-lettered without its value (its headers say
// so) and the partition moves on. A missing or forbidden dead-letter topic fails every record
// alike: the partition waits, visibly, and nothing is skipped; once the operator creates the
// topic or grants the write, the record is dead-lettered once and the good record behind it is
// handled once. With --require-topics the consumer refuses to start instead.

// notAnEvent is a record without keiro headers: the consumer can only dead-letter it.
func notAnEvent(value []byte) consumerCase {
	return consumerCase{Name: fmt.Sprintf("%d bytes without keiro headers", len(value)), Key: []byte("k-dlq"),
		Value: value, MustDeadLetter: true}
}

// deadLetterSetup is one bad record (partition 0, offset 0) and a good record behind it, with
// the consumer binary in sql mode reading them; dlqTopic names the consumer's dead-letter topic
// ("" the default, created).
func deadLetterSetup(t *testing.T, kc *testenv.Kafka, bad consumerCase, dlqTopic string, extra ...string) (*adversarialConsumer, *proc) {
	a := newAdversarialConsumer(t, kc, []consumerCase{bad})
	if dlqTopic != "" {
		a.dlq = dlqTopic
		extra = append(extra, "KEIRO_CONSUMER_DLQ_TOPIC="+dlqTopic)
	}
	a.produce(keiroGood)
	return a, a.startConsumer(extra...)
}

// waitsVisibly waits until the consumer logged a failed dead-letter produce of the bad record
// (a line naming the dead-letter topic and the record's offset), and checks that the record is
// not skipped meanwhile: its offset is not committed and the good record behind it not handled.
func waitsVisibly(t *testing.T, a *adversarialConsumer, p *proc) {
	line := regexp.MustCompile(`level=(WARN|ERROR) .*` + regexp.QuoteMeta(a.dlq) + `.*offset=0|level=(WARN|ERROR) .*offset=0.*` + regexp.QuoteMeta(a.dlq))
	waitState(t, 60*time.Second, "a log line of the failed dead-letter produce (naming the topic and offset 0)", func() (bool, string) {
		return line.MatchString(p.log()), logTail(p)
	})
	offs, err := kadm.NewClient(a.kc.Client).FetchOffsets(context.Background(), a.group)
	require.NoError(t, err)
	if o, ok := offs.Lookup(a.topic, 0); ok {
		require.Zero(t, o.At, "the record whose dead letter failed was skipped (offset committed)\n%s", logTail(p))
	}
	for _, d := range a.effectsHandled() {
		require.Negative(t, d.good, "the good record was handled before the record in front of it\n%s", logTail(p))
	}
}

// TestAdversarialDeadLetter: dead-letter produces that fail.
func TestAdversarialDeadLetter(t *testing.T) {
	t.Parallel()
	t.Run("too large", func(t *testing.T) {
		t.Parallel()
		// ~999,900 bytes fit Kafka's limits; its dead-letter copy, eight headers more, does not
		// fit the producer's 1,000,012-byte batch.
		testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, kc *testenv.Kafka) {
			a, p := deadLetterSetup(t, kc, notAnEvent(bytes.Repeat([]byte("x"), 999_900)), "")
			a.check(a.effectsHandled, func() string { return logTail(p) })
			require.Equal(t, 0, p.term(t, 30*time.Second), logTail(p))
		})
	})
	t.Run("topic missing", func(t *testing.T) {
		t.Parallel()
		testenv.EachKafka(t, testenv.KafkaConfig{DisableAutoCreate: true}, func(t *testing.T, kc *testenv.Kafka) {
			dlq := kc.Topic("adv.in.missing-dlq")
			a, p := deadLetterSetup(t, kc, notAnEvent([]byte("not an event")), dlq)
			waitsVisibly(t, a, p)
			kc.CreateTopic(t, dlq, 1) // the operator's fix
			a.check(a.effectsHandled, func() string { return logTail(p) })
			require.Equal(t, 0, p.term(t, 30*time.Second), logTail(p))
		})
	})
	t.Run("topic missing, --require-topics", func(t *testing.T) {
		t.Parallel()
		kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{DisableAutoCreate: true})
		a := newAdversarialConsumer(t, kc, []consumerCase{notAnEvent([]byte("not an event"))})
		dlq := kc.Topic("adv.in.missing-dlq")
		env := consumerEnv(a.db, kc, a.group, a.topic, "KEIRO_CONSUMER_SQL_FUNCTION="+a.db.Schema+".adv_apply",
			"KEIRO_CONSUMER_DLQ_TOPIC="+dlq, "KEIRO_CONSUMER_REQUIRE_TOPICS=true")
		p := startProc(t, "consumer", consumerBin, consumerAddrRe, env)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("the consumer did not refuse to start within 30s:\n%s", logTail(p))
		}
		require.Equal(t, 2, p.exitCode(), "a refusal to start exits 2:\n%s", p.log())
		require.Contains(t, p.log(), dlq, "the refusal names the missing topic")
	})
	t.Run("not authorised", func(t *testing.T) {
		t.Parallel()
		kc := testenv.NewKafka(t)
		dlq := kc.Topic("adv.in.dlq")
		outage := kc.FailProduces(t, testenv.ProduceFailure{Topics: []string{dlq}, Err: kerr.TopicAuthorizationFailed})
		a, p := deadLetterSetup(t, kc, notAnEvent([]byte("not an event")), "")
		select {
		case <-outage.Hit():
		case <-time.After(60 * time.Second):
			t.Fatalf("no dead-letter produce reached the broker within 60s:\n%s", logTail(p))
		}
		waitsVisibly(t, a, p)
		outage.End() // the operator grants the write
		a.check(a.effectsHandled, func() string { return logTail(p) })
		require.True(t, strings.Contains(p.log(), kerr.TopicAuthorizationFailed.Message), "the log names the broker's refusal")
		require.Equal(t, 0, p.term(t, 30*time.Second), logTail(p))
	})
}
