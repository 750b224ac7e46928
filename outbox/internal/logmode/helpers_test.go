package logmode_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/internal/logmode"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// fixture is one test's schema, slot and Kafka.
type fixture struct {
	db    *testenv.DB
	kafka *testenv.Kafka
	cfg   logsource.Config
	// onRejected, if set, is the publisher's dead-letter sink of the engines newEngine builds.
	onRejected func(publish.Rejection) error
}

// newFixture migrates a schema and starts a broker; the slot and publication the engines
// create are dropped when the test ends (a slot left behind keeps WAL on the server).
func newFixture(t *testing.T, kcfg testenv.KafkaConfig) *fixture {
	t.Helper()
	return newFixtureOn(t, testenv.NewKafkaWith(t, kcfg))
}

// newFixtureOn is newFixture on a Kafka of the caller's (testenv.EachKafka's).
func newFixtureOn(t *testing.T, kafka *testenv.Kafka) *fixture {
	t.Helper()
	db := testenv.NewDB(t)
	f := &fixture{db: db, kafka: kafka, cfg: logsource.Config{
		Schema: db.Schema, StatusInterval: 200 * time.Millisecond, StandbyRetry: 100 * time.Millisecond,
		RetryBackoff: 50 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
	}}
	// The slot exists before any event is written: a slot decodes only the transactions that
	// commit after its creation.
	name := db.Schema + "_keiro_log"
	ctx := context.Background()
	sweepAbandonedSlots(t, db.Pool)
	_, err := db.Pool.Exec(ctx, "CREATE PUBLICATION "+name+" FOR TABLE keiro_outbox_log WITH (publish = 'insert')")
	require.NoError(t, err)
	t.Cleanup(func() { dropSlot(t, db.Pool, name) })
	_, err = db.Pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name)
	require.NoError(t, err)
	return f
}

// dropSlot drops the slot and the publication named name, ending a reader still on it.
func dropSlot(t testing.TB, pool *pgxpool.Pool, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
			WHERE slot_name = $1 AND active_pid IS NOT NULL`, name)
		if err == nil {
			_, err = pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
		}
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // the terminated reader's slot is released shortly after
	}
	if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+name); err != nil {
		t.Errorf("drop publication %s: %v", name, err)
	}
}

// newEngine returns an engine with a producer client of its own, built with the claim
// relay's options.
func (f *fixture) newEngine(t *testing.T, cfg logsource.Config, h logmode.Hooks, opts ...kgo.Opt) *logmode.Engine {
	t.Helper()
	client := f.kafka.NewClient(t, append(outbox.ProducerOpts(), opts...)...)
	pub, err := publish.New(publish.Config{Client: client, DeadLetter: f.onRejected})
	require.NoError(t, err)
	e, err := logmode.New(f.db.ConnString, pub, cfg)
	require.NoError(t, err)
	logmode.SetHooks(e, h)
	return e
}

// run runs e until the returned stop is called (or the test ends).
func run(t *testing.T, e *logmode.Engine) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

// event is one row of keiro_outbox_log.
type event struct {
	id, dest, key string
	payload       []byte
}

// insertSQL writes events the way any producer may: a plain INSERT of the envelope.
const insertSQL = `INSERT INTO keiro_outbox_log (outbox_id, message_id, source, destination, message_key, event_type,
    schema_version, content_type, payload_bytes, occurred_at, traceparent)
SELECT gen_random_uuid(), id, 'ordering', dest, nullif(key, ''), 'OrderPlaced', 1, 'application/json', payload, now(),
    '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[]) AS e(id, dest, key, payload)`

// enqueue writes events in one transaction of q.
func enqueue(ctx context.Context, tx pgx.Tx, events ...event) error {
	ids, dests, keys, payloads := make([]string, len(events)), make([]string, len(events)), make([]string, len(events)), make([][]byte, len(events))
	for i, e := range events {
		ids[i], dests[i], keys[i], payloads[i] = e.id, e.dest, e.key, e.payload
		if payloads[i] == nil {
			payloads[i] = []byte(`{"n":` + fmt.Sprint(i) + `}`)
		}
	}
	_, err := tx.Exec(ctx, insertSQL, ids, dests, keys, payloads)
	return err
}

// commitEvents writes events in one transaction of pool.
func commitEvents(t testing.TB, pool *pgxpool.Pool, events ...event) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return enqueue(ctx, tx, events...) })
	require.NoError(t, err)
}

// ids returns the message ids of recs, in order.
func ids(recs []*kgo.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		for _, h := range r.Headers {
			if h.Key == "keiro-message-id" {
				out[i] = string(h.Value)
			}
		}
	}
	return out
}

// sweepAbandonedSlots drops the slots of earlier test runs that ended without their cleanup (a
// test binary killed by its -timeout): inactive slots of a test schema's name that keep more
// than 1 GiB of WAL. Left alone they would make the shared server keep WAL without bound.
func sweepAbandonedSlots(t testing.TB, pool *pgxpool.Pool) {
	if _, err := pool.Exec(context.Background(), sqlSweepSlots); err != nil {
		t.Logf("sweep abandoned test slots: %v", err)
	}
}

// sqlSweepSlots is sweepAbandonedSlots' statement.
const sqlSweepSlots = `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
WHERE NOT active AND slot_name ~ '^t_[0-9a-f]{12}_keiro_log$'
  AND pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) > 1073741824`

// sendNoWait sends v on ch unless ch is full. A hook runs on the engine's goroutine: one that
// blocks would keep the engine from ever stopping, and a failed test's cleanup, which waits for
// the engine, would hang the package until its timeout instead of reporting the failure.
func sendNoWait[T any](ch chan<- T, v T) {
	select {
	case ch <- v:
	default:
	}
}
