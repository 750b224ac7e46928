package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/pgbouncer"
	"github.com/keiro-go/keiro/outbox"
)

// TestThroughPgBouncer runs the relay (polling only) and the consumer with every database
// connection through a real PgBouncer in transaction pooling mode: rows are published and
// consumed exactly once, the relay's retention deletes the sent rows, the consumer's retention
// the completed inbox rows, and neither logs a missing prepared statement (SQLSTATE 26000) or a
// failed maintenance pass. Migrations, which need a session, are refused with --pgbouncer.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	eachKafka(t, testThroughPgBouncer)
}

func testThroughPgBouncer(t *testing.T, kc *testenv.Kafka) {
	ctx := context.Background()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	topic, group := kc.Topic("e2e.pgbouncer.v1"), kc.Group("bounced")
	kc.CreateTopic(t, topic, 3)
	kc.CreateTopic(t, topic+".dlq", 1)
	pgb := pgbouncer.Start(t)

	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	want := map[string]int64{}
	var evs []envelope.Event
	for seq := int64(1); seq <= 20; seq++ {
		for k := range 10 {
			key := fmt.Sprintf("k%02d", k)
			evs = append(evs, keyedEvent(topic, key, seq))
			want[key] = seq
		}
	}
	require.NoError(t, enqueue(ctx, db.Pool, ob, evs...))

	bounced := func(prefix string) []string {
		return []string{prefix + "_DATABASE_URL=" + pgb.URL(), prefix + "_PGBOUNCER=true"}
	}
	relay := startProc(t, "relay", relayBin, relayAddrRe, relayEnv(db, kc, append(bounced("KEIRO_RELAY"),
		"KEIRO_RELAY_RETENTION=1ms", "KEIRO_RELAY_MAINTENANCE_INTERVAL=200ms",
		"KEIRO_RELAY_CLAIM_CONCURRENCY=2", "KEIRO_RELAY_MAX_IN_FLIGHT=4", "KEIRO_RELAY_BATCH_SIZE=16")...))
	cons := startProc(t, "consumer", consumerBin, consumerAddrRe, consumerEnv(db, kc, group, topic, append(bounced("KEIRO_CONSUMER"),
		"KEIRO_CONSUMER_RETENTION=1ms", "KEIRO_CONSUMER_MAINTENANCE_INTERVAL=200ms", "KEIRO_CONSUMER_CONCURRENCY=3")...))
	relay.waitAddr(t, 30*time.Second)
	cons.waitAddr(t, 30*time.Second)

	adm := kadm.NewClient(kc.Client)
	// The binaries are other processes: the database state is the signal, the tick bounds polling.
	require.Eventually(t, func() bool {
		var effects, outboxRows, inboxRows int64
		_ = db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+db.Schema+`.effects),
  (SELECT count(*) FROM `+db.Schema+`.keiro_outbox), (SELECT count(*) FROM `+db.Schema+`.keiro_inbox)`).
			Scan(&effects, &outboxRows, &inboxRows)
		return effects == 200 && outboxRows == 0 && inboxRows == 0 && committedAll(ctx, adm, group, topic)
	}, 90*time.Second, 50*time.Millisecond,
		"every row published, consumed and then deleted by both retentions\nrelay:\n%s\nconsumer:\n%s", relay.log(), cons.log())

	require.Equal(t, 0, cons.term(t, 30*time.Second), cons.log())
	require.Equal(t, 0, relay.term(t, 30*time.Second), relay.log())
	for _, p := range []*proc{relay, cons} {
		out := p.log()
		for _, bad := range []string{"26000", "does not exist", "maintenance failed", `msg="inbox retention"`, "level=ERROR", "level=WARN"} {
			require.NotContains(t, out, bad, "%s log:\n%s", p.name, out)
		}
	}
	require.Contains(t, relay.log(), "polling only", "--pgbouncer implies --poll-only")

	var effects, distinct int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM `+db.Schema+`.effects`).Scan(&effects, &distinct))
	require.Equal(t, int64(200), effects)
	require.Equal(t, int64(200), distinct, "each event applied once")

	// Operator commands work through PgBouncer; migrations are refused with a way out.
	for _, c := range []struct {
		bin, prefix string
		args        []string
		code        int
		out         string
	}{
		{relayBin, "KEIRO_RELAY", []string{"status"}, 0, "backlog"},
		{consumerBin, "KEIRO_CONSUMER", []string{"status", "--name", group}, 0, "schema " + db.Schema},
		{relayBin, "KEIRO_RELAY", []string{"migrate"}, 2, "session advisory lock"},
		{consumerBin, "KEIRO_CONSUMER", []string{"migrate"}, 2, "session advisory lock"},
	} {
		cmd := exec.Command(c.bin, c.args...)
		cmd.Env = append(baseEnv(), append(bounced(c.prefix), c.prefix+"_SCHEMA="+db.Schema)...)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		require.Equal(t, c.code, code, "%s %s:\n%s", c.bin, strings.Join(c.args, " "), out)
		require.Contains(t, string(out), c.out)
	}
	require.NotContains(t, pgb.Log(), "FATAL")
}
