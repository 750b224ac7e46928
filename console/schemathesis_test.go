package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/apifuzz"
)

// TestSchemathesis fuzzes the admin API from its own OpenAPI document with schemathesis: a
// console serving the outbox, an inbox with a handler, a dead-letter topic and the event
// store, over PostgreSQL and a Kafka cluster, with dead rows, a poisoned message and a dead
// letter in them (keirotest/testenv/apifuzz: no 5xx, only the statuses and JSON the document declares).
func TestSchemathesis(t *testing.T) {
	t.Parallel()
	const topic, dlq, token = "orders.fz.v1", "orders.fz.v1.dlq", "fuzz-token"
	logs := &testenv.LogBuffer{}
	r := newRig(t, func(c *console.Config) {
		c.Inbox.DeadLetterTopics, c.Inbox.Topics = []string{dlq}, []string{topic}
		c.Auth = console.AuthConfig{Token: token}
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelError}))
	})
	ids := r.enqueue(t, event("f1", "payments.v1", ptr("k1"), `{"a":1}`), event("f2", "payments.v1", nil, "text"))
	r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'dead', attempt_count = 2, last_error = 'boom 1' WHERE outbox_id = $1`, r.db.Schema), ids[0])
	r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'rejected', rejected_at = now(), rejection_code = 'message_too_large', last_error = 'big' WHERE outbox_id = $1`, r.db.Schema), ids[1])
	r.process(t, event("p-1", topic, ptr("k"), `{"poison":true}`), 0, 3)
	r.kc.CreateTopic(t, dlq, 1)
	dl := record(event("d-1", topic, ptr("k"), `{}`), dlq)
	dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: "keiro-dlq-reason", Value: []byte("decode")},
		kgo.RecordHeader{Key: "keiro-dlq-topic", Value: []byte(topic)})
	require.NoError(t, r.kc.NewClient(t).ProduceSync(context.Background(), dl).FirstErr())

	apifuzz.Run(t, r.srv.URL, token, logs.String)
}
