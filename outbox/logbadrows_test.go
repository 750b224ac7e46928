package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// insertLogRow writes an event into keiro_outbox_log by a plain SQL INSERT (a writer the docs
// support), with destination dest and key k.
func insertLogRow(t *testing.T, pool *pgxpool.Pool, id, dest, k string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO keiro_outbox_log (outbox_id, message_id, source, destination,
    message_key, event_type, schema_version, content_type, payload_bytes, occurred_at)
VALUES (gen_random_uuid(), $1, 'ordering', $2, $3, 'OrderPlaced', 1, 'application/json', '{}', now())`, id, dest, k)
	require.NoError(t, err)
}

// A log-mode relay meets rows of one key written by plain SQL, among them an empty
// destination, an illegal topic and a topic Kafka does not have: each bad row ends as a
// rejected row of keiro_outbox with its code (relay dead list), the good rows are published
// once each, in order, and the slot confirms past all of them in its first session (no
// replay loop). Before, the empty destination ended the session ("no topic", transient) and
// every next session replayed from it, forever; the unknown topic waited forever.
func TestLogModeBadDestinationsAreRejected(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{Partitions: 1, DisableAutoCreate: true}, func(t *testing.T, kc *testenv.Kafka) {
		db := testenv.NewDB(t)
		topic, missing := kc.Topic("orders"), kc.Topic("missing")
		kc.CreateTopic(t, topic, 1)
		st, err := outbox.NewStore(db.Schema)
		require.NoError(t, err)
		dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
		r, _ := startRelayOpts(t, db, kc, outboxOpts(), outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine,
			PollInterval: 50 * time.Millisecond, Logger: testLogger(t), LogUnknownTopicRetries: 20})
		testenv.WaitFor(t, time.Minute, "the log-mode relay switched the schema", func() bool {
			m, err := outbox.AdminOf(st).Mode(context.Background(), db.Pool)
			return err == nil && m == outbox.ModeLog
		})

		insertLogRow(t, db.Pool, "good-1", topic, "k")
		insertLogRow(t, db.Pool, "empty", "", "k")
		insertLogRow(t, db.Pool, "good-2", topic, "k")
		insertLogRow(t, db.Pool, "illegal", "bad topic!", "k")
		insertLogRow(t, db.Pool, "unknown", missing, "k")
		insertLogRow(t, db.Pool, "good-3", topic, "k")
		lsn := walPosition(t, db.Pool)

		for id, code := range map[string]string{"empty": "invalid_topic", "illegal": "invalid_topic",
			"unknown": "unknown_topic_or_partition"} {
			dead := waitDead(t, db.Pool, st, id)
			require.Equal(t, outbox.StatusRejected, dead.Status, id)
			require.Equal(t, code, dead.RejectionCode, id)
			require.NotEmpty(t, dead.LastError, id)
			require.Equal(t, "k", *dead.Key, id)
		}
		confirmedPast(t, db.Pool, outbox.DefaultLogSlot(db.Schema), lsn)
		require.Equal(t, []string{"good-1", "good-2", "good-3"}, recordIDs(t, kc.ConsumeRecords(t, 4, 5*time.Second, topic)),
			"the good rows once each, in order")
		require.EqualValues(t, 1, outbox.LogSessions(r), "one session: no replay")
		require.EqualValues(t, 3, r.Stats().Rejected)
	})
}

// In claim mode a row whose destination is not a legal topic (empty, or "bad topic!") is
// rejected at once with code invalid_topic and a readable reason, on its first attempt,
// instead of using its attempts ("no topic" from the client was transient before); the rows
// of its key behind it are published.
func TestClaimModeIllegalTopicIsRejectedAtOnce(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	ctx := context.Background()
	const insert = `INSERT INTO keiro_outbox (outbox_id, message_id, source, destination, message_key,
    event_type, schema_version, content_type, payload_bytes, occurred_at)
VALUES (gen_random_uuid(), $1, 'ordering', $2, 'k', 'OrderPlaced', 1, 'application/json', '{}', now())`
	for _, r := range [][2]string{{"good-1", "orders"}, {"empty", ""}, {"illegal", "bad topic!"}, {"good-2", "orders"}} {
		_, err := db.Pool.Exec(ctx, insert, r[0], r[1])
		require.NoError(t, err)
	}
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), PollInterval: 10 * time.Millisecond,
		Backoff: keiro.Backoff{Initial: time.Hour}, Logger: testLogger(t)})
	p.Wait(t, 4, time.Minute, nil)
	for _, id := range []string{"empty", "illegal"} {
		dead := waitDead(t, db.Pool, st, id)
		require.Equal(t, outbox.StatusRejected, dead.Status, id)
		require.Equal(t, "invalid_topic", dead.RejectionCode, id)
		require.Contains(t, dead.LastError, "destination", id)
	}
	require.Equal(t, []string{"good-1", "good-2"}, recordIDs(t, kc.ConsumeRecords(t, 2, time.Minute, "orders")))
}
