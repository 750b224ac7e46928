package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// Parameters of TestForwardKilled.
const (
	forwardEvents     = 2000
	forwardKeys       = 40
	forwardChunks     = 8 // the events are produced in chunks; a kill follows each chunk but the last
	forwardPartitions = 3
	forwardLease      = 2 * time.Second
	// A killed consumer's partitions move after its session: kfake allows a shorter one than its default minimum of 6s.
	forwardSession   = 5 * time.Second // above the consumer's 3s heartbeat
	forwardRebalance = 6 * time.Second
)

// forwardRelayEnv are the relay's settings of TestForwardKilled beyond relayEnv's: exactly-once
// publication, so that a relay killed with records in flight publishes none of them twice.
func forwardRelayEnv() []string {
	return []string{"KEIRO_RELAY_LEASE=" + forwardLease.String(), "KEIRO_RELAY_MAX_ATTEMPTS=100",
		"KEIRO_RELAY_EXACTLY_ONCE=true"}
}

// forwardFixture creates forward_event(doc), the consumer's sql-mode handler of
// TestForwardKilled: it enqueues, through the outbox's SQL enqueue function and in the inbox
// transaction, one event on dest per consumed event, with a fresh message id (so that only the
// inbox keeps a redelivered record from enqueueing twice) and the consumed message id and seq
// in its payload.
func forwardFixture(t *testing.T, db *testenv.DB, dest string) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE FUNCTION %[1]s.forward_event(doc jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM %[1]s.enqueue(
    source      => 'e2e-forwarder',
    message_id  => gen_random_uuid()::text,
    destination => %[2]s,
    event_type  => 'CountedForwarded',
    payload     => convert_to(jsonb_build_object(
                     'source_message_id', doc->>'message_id', 'seq', doc->'payload'->'seq')::text, 'UTF8'),
    occurred_at => (doc->>'occurred_at')::timestamptz,
    message_key => doc->>'key');
END $$;`, db.Schema, quoteLiteral(dest)))
	require.NoError(t, err)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// TestForwardKilled: the consume → produce pattern through both sidecars. Events on topic A are
// consumed by the consumer binary, whose sql-mode handler enqueues one event per consumed event
// into the outbox in the inbox transaction; the relay binary publishes the outbox to topic B.
// While the events flow, the consumer, the relay or both are SIGKILLed and restarted after each
// chunk. At the end the outbox holds exactly one row per consumed message, and topic B holds
// each consumed message's event once, in key order, for a read_committed reader.
func TestForwardKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{ClusterOpts: []kfake.Opt{kfake.GroupMinSessionTimeout(forwardSession)}})
	db := testenv.NewDB(t)
	topicA, topicB, group := kc.Topic("e2e.orders.v1"), kc.Topic("e2e.invoices.v1"), kc.Group("forwarder")
	kc.CreateTopic(t, topicA, forwardPartitions)
	kc.CreateTopic(t, topicB, forwardPartitions)
	kc.CreateTopic(t, topicA+".dlq", 1)
	forwardFixture(t, db, topicB)

	// The events of A, in production order; each key's seq counts from 1.
	evs := make([]envelope.Event, forwardEvents)
	ids := make([]string, forwardEvents)
	for i := range evs {
		key := fmt.Sprintf("k%02d", i%forwardKeys)
		evs[i] = keyedEvent(topicA, key, int64(i/forwardKeys+1))
		ids[i] = evs[i].MessageID
	}

	startConsumer := func() *proc {
		p := startProc(t, "consumer", consumerBin, consumerAddrRe, consumerEnv(db, kc, group, topicA,
			"KEIRO_CONSUMER_SQL_FUNCTION="+db.Schema+".forward_event",
			"KEIRO_CONSUMER_BATCH_SIZE=25",
			"KEIRO_CONSUMER_SESSION_TIMEOUT="+forwardSession.String(),
			"KEIRO_CONSUMER_REBALANCE_TIMEOUT="+forwardRebalance.String()))
		p.waitAddr(t, 30*time.Second)
		return p
	}
	startRelay := func() *proc {
		p := startProc(t, "relay", relayBin, relayAddrRe, relayEnv(db, kc, forwardRelayEnv()...))
		p.waitAddr(t, 30*time.Second)
		return p
	}
	// counts reads the outbox: rows, and rows the relay has marked sent.
	counts := func() (rows, sent int64) {
		_ = db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'sent') FROM `+db.Schema+`.keiro_outbox`).Scan(&rows, &sent)
		return rows, sent
	}
	cons, relay := startConsumer(), startRelay()
	var logs []string // the output of the killed processes, for a failure message
	kill := func(p *proc) {
		p.kill()
		logs = append(logs, p.name+":\n"+tail(p.log(), 2000))
	}

	chunk := forwardEvents / forwardChunks
	for c := range forwardChunks {
		part := evs[c*chunk : (c+1)*chunk]
		recs := make([]*kgo.Record, len(part))
		for i := range part {
			recs[i] = recordOf(part[i])
		}
		rows0, sent0 := counts()
		require.NoError(t, kc.Client.ProduceSync(ctx, recs...).FirstErr(), "produce chunk %d to A", c)
		if c == forwardChunks-1 {
			break
		}
		// Kill while the chunk flows: once the consumer has forwarded part of it (its kill), or
		// once the relay has published part of it (its kill). The condition is the signal (the
		// binaries are other processes); the tick bounds polling.
		switch c % 3 {
		case 0:
			require.Eventually(t, func() bool { rows, _ := counts(); return rows > rows0 }, 60*time.Second, 5*time.Millisecond,
				"the consumer forwards chunk %d\n%s", c, cons.log())
			kill(cons)
			cons = startConsumer()
		case 1:
			require.Eventually(t, func() bool { _, sent := counts(); return sent > sent0 }, 60*time.Second, 5*time.Millisecond,
				"the relay publishes chunk %d\n%s", c, relay.log())
			kill(relay)
			relay = startRelay()
		case 2:
			require.Eventually(t, func() bool { rows, sent := counts(); return rows > rows0 && sent > sent0 }, 60*time.Second, 5*time.Millisecond,
				"chunk %d flows", c)
			kill(cons)
			kill(relay)
			cons, relay = startConsumer(), startRelay()
		}
	}

	adm := kadm.NewClient(kc.Client)
	require.Eventually(t, func() bool {
		rows, sent := counts()
		return rows >= forwardEvents && sent == rows && committedAll(ctx, adm, group, topicA)
	}, 60*time.Second, 20*time.Millisecond, "every event forwarded and published\nconsumer:\n%s\nrelay:\n%s\nkilled:\n%s",
		tail(cons.log(), 2000), tail(relay.log(), 2000), strings.Join(logs, "\n"))
	require.Equal(t, 0, cons.term(t, 30*time.Second), cons.log())
	require.Equal(t, 0, relay.term(t, 30*time.Second), relay.log())

	// Exactly one outbox row per consumed message: the inbox row and the outbox row commit
	// together, and a redelivered record finds its inbox row.
	rows, err := db.Pool.Query(ctx, `SELECT convert_from(payload_bytes, 'UTF8')::jsonb->>'source_message_id', count(*)
		FROM `+db.Schema+`.keiro_outbox GROUP BY 1`)
	require.NoError(t, err)
	perSource := map[string]int64{}
	for rows.Next() {
		var id string
		var n int64
		require.NoError(t, rows.Scan(&id, &n))
		perSource[id] = n
	}
	require.NoError(t, rows.Err())
	var wrong []string
	for _, id := range ids {
		if perSource[id] != 1 {
			wrong = append(wrong, fmt.Sprintf("%s: %d outbox rows", id, perSource[id]))
		}
	}
	require.Empty(t, wrong, "one outbox row per consumed message")
	require.Len(t, perSource, forwardEvents, "no outbox row of a message that was not consumed")

	// Topic B, as a read_committed consumer sees it: each consumed message's event, in key
	// order; exactly once when the relay publishes exactly once.
	bySource := func(r keirotest.Record) string {
		var p struct {
			SourceMessageID string `json:"source_message_id"`
		}
		if err := envelope.DecodeJSON(&r.Event, &p); err != nil {
			return ""
		}
		return p.SourceMessageID
	}
	recs := keirotest.RequireExactlyOnce(t, &keirotest.Kafka{Kafka: kc}, topicB, keirotest.ExactlyOnce{
		MessageIDs: ids, ID: bySource,
	})
	t.Logf("topic B holds %d records for %d consumed messages (%d processes killed)", len(recs), forwardEvents, len(logs))
}

// recordOf is ev as the relay publishes it.
func recordOf(ev envelope.Event) *kgo.Record {
	r := ev.Record(envelope.EncodeOptions{})
	rec := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: make([]kgo.RecordHeader, len(r.Headers))}
	for i, h := range r.Headers {
		rec.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return rec
}
