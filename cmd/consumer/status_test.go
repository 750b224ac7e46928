package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/inbox/handlers"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// transientFailure is a handler whose every call fails with a retryable error.
func transientFailure(context.Context, pgx.Tx, envelope.Event) error {
	return errors.New("downstream busy")
}

// consumer status splits failed rows into retrying and poisoned per consumer name, reads the
// group's lag from Kafka, and prints JSON with --json; inbox failed list --json prints JSON lines.
func TestStatusAndFailedListJSON(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	sqlFixture(t, db)
	ctx := context.Background()
	h, err := handlers.NewSQL(handlers.SQLConfig{Function: db.Schema + ".apply_event"})
	require.NoError(t, err)
	billing, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "billing", MaxAttempts: 3})
	require.NoError(t, err)
	shipping, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "shipping", MaxAttempts: 3})
	require.NoError(t, err)

	// billing: one completed, one retrying (a failed attempt of 3), one poisoned; shipping: one completed.
	res, err := billing.Process(ctx, db.Pool, inbox.Delivery{Event: orderEvent("ok-1", 1)}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome)
	_, err = shipping.Process(ctx, db.Pool, inbox.Delivery{Event: orderEvent("ok-1", 1)}, h.Handle)
	require.NoError(t, err)
	res, err = billing.Process(ctx, db.Pool, inbox.Delivery{Event: orderEvent("retry-1", 2),
		Kafka: &inbox.KafkaRef{Topic: "orders.v1", Partition: 2, Offset: 41}}, transientFailure)
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
	bad := orderEvent("bad-1", 0)
	bad.Payload = []byte(`{"mode":"poison"}`)
	res, err = billing.Process(ctx, db.Pool, inbox.Delivery{Event: bad}, h.Handle)
	require.NoError(t, err)
	require.Equal(t, inbox.Poisoned, res.Outcome)

	// A group with a committed offset 1 behind the end of its topic: lag 2 on partition 0.
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "orders.v1", 1)
	cl := kc.NewClient(t)
	for range 3 {
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: "orders.v1", Value: []byte("x")}).FirstErr())
	}
	adm := kadm.NewClient(cl)
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "orders.v1", Partition: 0, At: 1})
	_, err = adm.CommitOffsets(ctx, "billing", offs)
	require.NoError(t, err)

	env := []string{"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(), "KEIRO_CONSUMER_SCHEMA=" + db.Schema}
	r := runBinary(t, 60*time.Second, env, "status", "--json", "--group=billing", "--brokers="+strings.Join(kc.Seeds, ","))
	require.Equal(t, 0, r.code, r.stderr)
	var st inboxStatus
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	require.Equal(t, map[string]consumerCounts{"billing": {Completed: 1, Retrying: 1, Poisoned: 1}}, st.Consumers)
	require.NotNil(t, st.Lag, r.stdout)
	require.Equal(t, int64(2), st.Lag.Total)
	require.Equal(t, map[string]map[int32]int64{"orders.v1": {0: 2}}, st.Lag.Topics)

	// Without a name: every consumer of the schema, as text.
	r = runBinary(t, 60*time.Second, env, "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `billing\s+1\s+1\s+1`, r.stdout)
	require.Regexp(t, `shipping\s+1\s+0\s+0`, r.stdout)
	require.Contains(t, r.stdout, "consumer billing: 2 failed rows (1 retrying, 1 poisoned")

	// Lag asked for but unreadable: exit 1, like the relay's failures to reach what it needs.
	r = runBinary(t, 60*time.Second, env, "status", "--group=billing", "--brokers=127.0.0.1:1")
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "read the lag of group billing")

	// The lag is read with the run command's TLS and SASL flags: TLS against this plaintext
	// broker fails, and flags that cannot work are refused before connecting (exit 2).
	r = runBinary(t, 60*time.Second, env, "status", "--group=billing", "--kafka-tls-enabled", "--brokers="+strings.Join(kc.Seeds, ","))
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "read the lag of group billing")
	r = runBinary(t, 60*time.Second, env, "status", "--group=billing", "--kafka-sasl-mechanism=PLAIN", "--brokers="+strings.Join(kc.Seeds, ","))
	require.Equal(t, 2, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "kafka-sasl-username")
	r = runBinary(t, 60*time.Second, env, "status", "--kafka-tls-enabled")
	require.Equal(t, 2, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "--brokers")

	// --admin-url: a URL that is not one is refused (exit 2), a consumer that does not answer
	// fails the command (exit 1) after the rest is printed.
	r = runBinary(t, 60*time.Second, env, "status", "--admin-url=127.0.0.1:9478")
	require.Equal(t, 2, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "--admin-url")
	r = runBinary(t, 60*time.Second, env, "status", "--admin-token-file=/nonexistent")
	require.Equal(t, 2, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "only applies with --admin-url")
	r = runBinary(t, 60*time.Second, env, "status", "--admin-url=http://127.0.0.1:1")
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "schema "+db.Schema)
	require.Contains(t, r.stderr, "ask the running consumer at http://127.0.0.1:1")

	r = runBinary(t, 60*time.Second, env, "inbox", "failed", "list", "--name=billing", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 2, r.stdout)
	byKey := map[string]failedRow{}
	for _, l := range lines {
		var fr failedRow
		require.NoError(t, json.Unmarshal([]byte(l), &fr), l)
		byKey[fr.Key] = fr
	}
	require.True(t, byKey["ordering:bad-1"].Poisoned)
	rf := byKey["ordering:retry-1"]
	require.False(t, rf.Poisoned)
	require.Equal(t, 1, rf.Attempts)
	require.Equal(t, "orders.v1", rf.Topic)
	require.Equal(t, int64(41), *rf.Offset)
	require.Contains(t, rf.LastError, "downstream busy")
}

// TestPrintPartitionsNamesDeadLetterWait: a partition waiting on a failing dead-letter produce
// says so, with the failure, ahead of its stuck flag.
func TestPrintPartitionsNamesDeadLetterWait(t *testing.T) {
	t.Parallel()
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var out strings.Builder
	printPartitions(&out, &console.ConsumerLag{Group: "billing", Partitions: []console.PartitionLag{{
		Topic: "orders.v1", Partition: 3, Lag: 12,
		Progress: &console.PartitionProgress{Waiting: 12, StuckSince: &since, DeadLetterBlockedSince: &since,
			DeadLetterError: "TOPIC_AUTHORIZATION_FAILED"},
	}}})
	require.Contains(t, out.String(), "WAITING ON THE DEAD-LETTER TOPIC since 2026-01-02T03:04:05Z: TOPIC_AUTHORIZATION_FAILED")
}
