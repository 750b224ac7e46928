package e2e

import (
	"context"
	"fmt"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestRelayStoppedPastItsLease: relay A is SIGSTOPped while its claim is in PostgreSQL (a
// trigger holds the claim a second, so the stop lands between the claim and the produce), and
// stays stopped past the lease while relay B takes the rows over and publishes them and the
// rows enqueued after them. After SIGCONT, A must not publish its stale batch (it was never
// produced): every event is on Kafka exactly once, in per-key order, and A says why.
func TestRelayStoppedPastItsLease(t *testing.T) {
	eachKafka(t, testRelayStoppedPastItsLease)
}

func testRelayStoppedPastItsLease(t *testing.T, kc *testenv.Kafka) {
	ctx := context.Background()
	db := testenv.NewDB(t)
	topic := kc.Topic("e2e.lease.v1")
	const keys, perKey = 10, 6
	kc.CreateTopic(t, topic, 3)
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`
CREATE TABLE %[1]s.slow_claim (armed boolean NOT NULL);
INSERT INTO %[1]s.slow_claim VALUES (true);
CREATE FUNCTION %[1]s.slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'publishing' AND OLD.status <> 'publishing' THEN
    UPDATE %[1]s.slow_claim SET armed = false WHERE armed;
    IF FOUND THEN PERFORM pg_sleep(1); END IF;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER slow_claim BEFORE UPDATE ON %[1]s.keiro_outbox FOR EACH ROW EXECUTE FUNCTION %[1]s.slow_claim();`, db.Schema))
	require.NoError(t, err)
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	enqueueRound := func(round int) {
		evs := make([]envelope.Event, 0, keys*perKey/2)
		for s := round*perKey/2 + 1; s <= (round+1)*perKey/2; s++ {
			for k := range keys {
				evs = append(evs, keyedEvent(topic, fmt.Sprintf("key-%02d", k), int64(s)))
			}
		}
		require.NoError(t, enqueue(ctx, db.Pool, ob, evs...))
	}
	enqueueRound(0)

	env := relayEnv(db, kc, "KEIRO_RELAY_LEASE=2s", "KEIRO_RELAY_LOG_LEVEL=warn")
	a := startProc(t, "relay-a", relayBin, relayAddrRe, env)
	// A's claim is held in the trigger: stop A there.
	testenv.WaitFor(t, 30*time.Second, "relay A's claim in the trigger", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()`).Scan(&n))
		return n > 0
	})
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	b := startProc(t, "relay-b", relayBin, relayAddrRe, env)
	enqueueRound(1)
	testenv.WaitFor(t, 60*time.Second, "relay B publishing every row", func() bool {
		var open int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_outbox WHERE status <> 'sent'`).Scan(&open))
		return open == 0
	})
	if d := 3*time.Second - time.Since(stopped); d > 0 {
		time.Sleep(d) // A stays stopped past its lease (2 s) even if B was quicker
	}
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	n := keys * perKey
	adm := kadm.NewClient(kc.Client)
	testenv.WaitFor(t, 30*time.Second, "relay A to report its lost lease or to publish", func() bool {
		if regexpLeaseLost.MatchString(a.log()) {
			return true
		}
		ends, err := adm.ListEndOffsets(ctx, topic)
		require.NoError(t, err)
		var records int64
		ends.Each(func(l kadm.ListedOffset) { records += l.Offset })
		return records > int64(n)
	})
	require.Equal(t, 0, a.term(t, 30*time.Second))
	require.Equal(t, 0, b.term(t, 30*time.Second))

	recs := consumeAll(t, kc, n+1, 3*time.Second, topic) // n+1: a duplicate would show
	require.Equal(t, n, len(recs), "every event on Kafka once: the stopped relay published nothing")
	require.Empty(t, keyInversions(recs), "per-key order on Kafka")
}

var regexpLeaseLost = regexp.MustCompile(`lease was lost or about to expire before its produce`)

// keyInversions lists, per key, the records whose event seq (keyedEvent's payload) is not
// above the key's previous first-seen seq, in the topic's partition order.
func keyInversions(recs []*kgo.Record) []string {
	last := map[string]int64{}
	seen := map[string]bool{}
	var out []string
	for _, r := range recs {
		var seq int64
		if _, err := fmt.Sscanf(string(r.Value), `{"seq":%d}`, &seq); err != nil {
			out = append(out, fmt.Sprintf("undecodable payload %q", r.Value))
			continue
		}
		id := fmt.Sprintf("%s/%d", r.Key, seq)
		if seen[id] {
			continue // a duplicate: the inbox drops it
		}
		seen[id] = true
		if seq <= last[string(r.Key)] {
			out = append(out, fmt.Sprintf("%s: %d after %d", r.Key, seq, last[string(r.Key)]))
		}
		last[string(r.Key)] = seq
	}
	return out
}
