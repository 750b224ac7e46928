package outbox_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// bigPayload is a JSON string of n incompressible letters (the producer compresses: a run of
// zeros would fit any limit).
func bigPayload(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(rng.IntN(26))
	}
	return `"` + string(b) + `"`
}

// setMaxMessageBytes sets a topic's max.message.bytes on the embedded broker.
func setMaxMessageBytes(t *testing.T, kc *testenv.Kafka, topic, v string) {
	t.Helper()
	res, err := kadm.NewClient(kc.Client).AlterTopicConfigs(context.Background(),
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr(v)}}, topic)
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
}

// startLogRelay switches db's schema to log mode with a log-mode relay and returns it once the
// switch is done.
func startLogRelay(t *testing.T, db *testenv.DB, kc *testenv.Kafka, st *outbox.Store, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	cfg.Mode, cfg.LogEngine, cfg.PollInterval, cfg.Logger = outbox.ModeLog, logrelay.Engine, 50*time.Millisecond, testLogger(t)
	r, _ := startRelay(t, db, kc, cfg)
	testenv.WaitFor(t, time.Minute, "the log-mode relay switched the schema", func() bool {
		m, err := outbox.AdminOf(st).Mode(context.Background(), db.Pool)
		return err == nil && m == outbox.ModeLog
	})
	return r
}

// waitDead waits until ListDead lists message id and returns its row.
func waitDead(t *testing.T, pool *pgxpool.Pool, st *outbox.Store, id string) outbox.DeadRow {
	t.Helper()
	var got outbox.DeadRow
	testenv.WaitFor(t, time.Minute, "the dead letter of "+id, func() bool {
		rows, err := outbox.AdminOf(st).ListDead(context.Background(), pool, outbox.ListDeadOptions{})
		require.NoError(t, err)
		for _, r := range rows {
			if r.MessageID == id {
				got = r
				return true
			}
		}
		return false
	})
	return got
}

// topicIDs returns the keiro-message-id header of each record, in order.
func topicIDs(t *testing.T, kc *testenv.Kafka, topic string) []string {
	t.Helper()
	var out []string
	for _, r := range kc.Records(t, topic) {
		for _, h := range r.Headers {
			if h.Key == "keiro-message-id" {
				out = append(out, string(h.Value))
			}
		}
	}
	return out
}

// In log mode a record Kafka refuses for good becomes a rejected row of keiro_outbox, with its
// code, error and the id EnqueueTx returned, listed by ListDead and counted by the dead gauge;
// the events after it (of its key and of others) are published. Requeued, it is published by
// the running log-mode relay's claim loop, after the later events of its key, and is sent.
func TestLogModeRejectionIsADeadLetterAndRequeues(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	ctx := context.Background()
	setMaxMessageBytes(t, kc, "orders", "2048")
	r := startLogRelay(t, db, kc, st, outbox.RelayConfig{})

	res := enqueue(t, db.Pool, st, event("ok-1", "orders", ptr("k"), `{}`),
		event("bad", "orders", ptr("k"), bigPayload(1, 16384)), event("ok-2", "orders", ptr("k"), `{}`),
		event("other-1", "orders", ptr("j"), `{}`))
	badID := res[1].OutboxID
	require.Equal(t, 4, count(t, db.Pool, "keiro_outbox_log"))

	dead := waitDead(t, db.Pool, st, "bad")
	require.Equal(t, outbox.StatusRejected, dead.Status)
	require.Equal(t, "message_too_large", dead.RejectionCode)
	require.NotEmpty(t, dead.LastError)
	require.Equal(t, badID, dead.OutboxID, "the dead letter keeps the id EnqueueTx returned")
	require.Equal(t, 1, dead.Attempts)
	require.Equal(t, "k", *dead.Key)
	row, err := outbox.AdminOf(st).Lookup(ctx, db.Pool, badID)
	require.NoError(t, err)
	require.Equal(t, bigPayload(1, 16384), string(row.Event.Payload), "the dead letter holds the whole event")
	require.Equal(t, "OrderPlaced", row.Event.EventType)
	require.Equal(t, time.Date(2026, 11, 29, 8, 0, 0, 123456000, time.UTC), row.Event.OccurredAt.UTC())
	require.EqualValues(t, 1, r.Stats().Rejected)
	m, err := r.MaintenancePass(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, m.Dead, "the dead gauge counts log-mode rejections")

	// The stream moved on: an event committed after the rejection is published after the
	// others, of both keys.
	enqueue(t, db.Pool, st, event("ok-3", "orders", ptr("k"), `{}`))
	kc.ConsumeRecords(t, 4, time.Minute, "orders")
	testenv.WaitFor(t, time.Minute, "ok-3 is published", func() bool {
		got := topicIDs(t, kc, "orders")
		return len(got) > 0 && got[len(got)-1] == "ok-3"
	})
	got := topicIDs(t, kc, "orders")
	require.Subset(t, got, []string{"ok-1", "ok-2", "other-1"})
	require.Equal(t, "ok-3", got[len(got)-1])
	require.NotContains(t, got, "bad")

	// The topic accepts it now; a requeue puts it back to pending, and the log-mode relay
	// publishes it.
	setMaxMessageBytes(t, kc, "orders", "1048588")
	n, err := outbox.AdminOf(st).Requeue(ctx, db.Pool, outbox.RequeueFilter{IDs: []envelope.UUID{badID}})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	testenv.WaitFor(t, time.Minute, "the requeued dead letter is published, after the later events of its key", func() bool {
		got := topicIDs(t, kc, "orders")
		return got[len(got)-1] == "bad"
	})
	testenv.WaitFor(t, time.Minute, "the requeued row is sent", func() bool {
		row, err := outbox.AdminOf(st).Lookup(ctx, db.Pool, badID)
		require.NoError(t, err)
		return row.Status == "sent"
	})
	require.Equal(t, 5, count(t, db.Pool, "keiro_outbox_log"), "the requeue moved no row of keiro_outbox_log")
}

// A record larger than MaxRecordBytes, refused before it reaches Kafka, is a dead letter too.
func TestLogModeTooLargeRecordIsADeadLetter(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	r := startLogRelay(t, db, kc, st, outbox.RelayConfig{MaxRecordBytes: 4096})
	enqueue(t, db.Pool, st, event("huge", "orders", ptr("k"), bigPayload(2, 8192)))
	enqueue(t, db.Pool, st, event("after", "orders", ptr("k"), `{}`))
	dead := waitDead(t, db.Pool, st, "huge")
	require.Equal(t, "message_too_large", dead.RejectionCode)
	require.Contains(t, dead.LastError, "MaxRecordBytes")
	kc.ConsumeRecords(t, 1, time.Minute, "orders")
	require.Equal(t, []string{"after"}, topicIDs(t, kc, "orders"))
	require.EqualValues(t, 1, r.Stats().Rejected)
}

// While the dead letter cannot be written (here a trigger refuses it), the rejected event's
// transaction is not confirmed: the engine's session ends, and the next one replays it and
// tries again. Once the write works, the row is written exactly once and the stream goes on.
func TestLogModeDeadLetterWriteFailureReplays(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	ctx := context.Background()
	setMaxMessageBytes(t, kc, "orders", "2048")
	// A sequence counts the refused writes: nextval is not rolled back with the statement.
	_, err := db.Pool.Exec(ctx, `CREATE SEQUENCE dead_letter_refusals;
CREATE FUNCTION refuse_dead_letter() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('dead_letter_refusals');
    RAISE EXCEPTION 'dead letters are refused';
END $$;
CREATE TRIGGER refuse_dead_letter BEFORE INSERT ON keiro_outbox
    FOR EACH ROW WHEN (NEW.status = 'rejected') EXECUTE FUNCTION refuse_dead_letter()`)
	require.NoError(t, err)
	r := startLogRelay(t, db, kc, st, outbox.RelayConfig{})
	enqueue(t, db.Pool, st, event("bad", "orders", ptr("k"), bigPayload(3, 16384)), event("ok-1", "orders", ptr("k"), `{}`))
	refusals := func() int64 {
		var n int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM dead_letter_refusals`).Scan(&n))
		return n
	}
	testenv.WaitFor(t, time.Minute, "a replay of the transaction tried the dead letter again", func() bool { return refusals() >= 2 })
	dead, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{})
	require.NoError(t, err)
	require.Empty(t, dead)
	require.Zero(t, r.Stats().Rejected, "a rejection counts once written")

	_, err = db.Pool.Exec(ctx, `DROP TRIGGER refuse_dead_letter ON keiro_outbox`)
	require.NoError(t, err)
	waitDead(t, db.Pool, st, "bad")
	enqueue(t, db.Pool, st, event("ok-2", "orders", ptr("k"), `{}`))
	testenv.WaitFor(t, time.Minute, "ok-2 is published", func() bool {
		got := topicIDs(t, kc, "orders")
		return len(got) > 0 && got[len(got)-1] == "ok-2"
	})
	var rows int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM keiro_outbox WHERE message_id = 'bad'`).Scan(&rows))
	require.Equal(t, 1, rows)
	require.EqualValues(t, 1, r.Stats().Rejected)
}

// In log mode the insert trigger routes a pending row to keiro_outbox_log and a row inserted
// as rejected (a dead letter) to keiro_outbox, with a seq; so does it in claim mode for an
// event keiro_outbox_log already holds.
func TestLogModeTriggerRoutesOnlyPendingRows(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	_, err = outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeLog, "")
	require.NoError(t, err)
	const insert = `INSERT INTO keiro_outbox (outbox_id, message_id, source, destination, message_key,
    event_type, schema_version, content_type, payload_bytes, occurred_at, status, rejected_at, rejection_code, attempt_count)
VALUES (gen_random_uuid(), $1, 'ordering', 'orders', 'k', 'OrderPlaced', 1, 'application/json', '{}', now(), $2,
    CASE WHEN $2 = 'rejected' THEN now() END, CASE WHEN $2 = 'rejected' THEN 'message_too_large' END, 0)`
	_, err = db.Pool.Exec(ctx, insert, "p1", "pending")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, insert, "r1", "rejected")
	require.NoError(t, err)
	where := func(id string) (log, claim int, seq *int64) {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM keiro_outbox_log WHERE message_id = $1),
			(SELECT count(*) FROM keiro_outbox WHERE message_id = $1), (SELECT seq FROM keiro_outbox WHERE message_id = $1)`, id).
			Scan(&log, &claim, &seq))
		return
	}
	l, c, _ := where("p1")
	require.Equal(t, [2]int{1, 0}, [2]int{l, c}, "a pending row in log mode")
	l, c, seq := where("r1")
	require.Equal(t, [2]int{0, 1}, [2]int{l, c}, "a rejected row in log mode")
	require.NotNil(t, seq)
	dead, err := outbox.AdminOf(st).ListDead(ctx, db.Pool, outbox.ListDeadOptions{})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "r1", dead[0].MessageID)

	// Claim mode: a pending row of an event keiro_outbox_log holds writes nothing; its dead
	// letter goes to keiro_outbox.
	_, err = outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeClaim, "")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, insert, "p1", "pending")
	require.NoError(t, err)
	l, c, _ = where("p1")
	require.Equal(t, [2]int{1, 0}, [2]int{l, c}, "a duplicate of a log-mode event in claim mode")
	_, err = db.Pool.Exec(ctx, insert, "p1", "rejected")
	require.NoError(t, err)
	l, c, _ = where("p1")
	require.Equal(t, [2]int{1, 1}, [2]int{l, c}, "the dead letter of a log-mode event in claim mode")
}
