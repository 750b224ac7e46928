package outbox_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// The tests in this file write the outbox the way a service in another language does: a plain
// INSERT from pgx (no EnqueueTx) or from psql, with no keiro code and no lock of its own. The
// order they get must come from the database alone.

// plainWriter is a client that writes the outbox with plain SQL.
type plainWriter int

const (
	pgxWriter plainWriter = iota
	psqlWriter
)

func (w plainWriter) String() string { return [...]string{"pgx", "psql"}[w] }

// plainRow is one outbox row written by plain SQL; key nil means a null key.
type plainRow struct {
	id, source, topic string
	key               *string
	i                 int
}

// insertSQL is the row's INSERT as a producer without keiro writes it (literals, so psql can
// run the same text; the values are the test's own).
func (r plainRow) insertSQL() string {
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	key := "NULL"
	if r.key != nil {
		key = lit(*r.key)
	}
	return fmt.Sprintf(`INSERT INTO keiro_outbox (outbox_id, message_id, source, destination, message_key,
    event_type, schema_version, content_type, payload_bytes, occurred_at)
VALUES (gen_random_uuid(), %s, %s, %s, %s, 'OrderPlaced', 1, 'application/json',
    convert_to(%s, 'UTF8'), now())`, lit(r.id), lit(r.source), lit(r.topic), key, lit(fmt.Sprintf(`{"i":%d}`, r.i)))
}

// openTx is a producer's transaction that inserted its row and has not committed yet.
type openTx interface{ commit() error }

type pgxOpenTx struct {
	conn *pgx.Conn
	tx   pgx.Tx
}

func (o *pgxOpenTx) commit() error {
	defer o.conn.Close(context.Background())
	return o.tx.Commit(context.Background())
}

type psqlOpenTx struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bytes.Buffer
}

func (o *psqlOpenTx) commit() error {
	_, err := io.WriteString(o.stdin, "COMMIT;\n")
	if cerr := o.stdin.Close(); err == nil {
		err = cerr
	}
	if werr := o.cmd.Wait(); werr != nil {
		return fmt.Errorf("psql: %v: %s", werr, o.out)
	}
	return err
}

// psql returns a psql command on db's schema, its sessions named app in pg_stat_activity.
func psql(t testing.TB, db *testenv.DB, app string, args ...string) *exec.Cmd {
	t.Helper()
	path, err := exec.LookPath("psql")
	require.NoError(t, err, "psql (the PostgreSQL client) is required by the plain-SQL producer tests")
	cmd := exec.Command(path, append([]string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", testenv.DatabaseURL()}, args...)...)
	cmd.Env = append(os.Environ(), "PGAPPNAME="+app, "PGOPTIONS=-c search_path="+db.Schema)
	return cmd
}

// connectApp opens a connection on db's schema named app in pg_stat_activity.
func connectApp(ctx context.Context, t testing.TB, db *testenv.DB, app string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, db.ConnString+"&application_name="+app)
	require.NoError(t, err)
	return conn
}

// begin starts a transaction with w, inserts r and returns once the row is inserted.
func begin(ctx context.Context, t testing.TB, db *testenv.DB, w plainWriter, app string, r plainRow) openTx {
	t.Helper()
	if w == pgxWriter {
		conn := connectApp(ctx, t, db, app)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, r.insertSQL())
		require.NoError(t, err)
		return &pgxOpenTx{conn: conn, tx: tx}
	}
	cmd := psql(t, db, app)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	_, err = io.WriteString(stdin, "BEGIN;\n"+r.insertSQL()+";\n")
	require.NoError(t, err)
	// The row is inserted once the session holds a transaction id and is idle in it.
	testenv.WaitFor(t, 30*time.Second, "psql inserted "+r.id, func() bool {
		var ok bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
            WHERE application_name = $1 AND state = 'idle in transaction' AND backend_xid IS NOT NULL)`, app).Scan(&ok))
		return ok
	})
	return &psqlOpenTx{cmd: cmd, stdin: stdin, out: out}
}

// insert inserts r with w in a transaction of its own, in the background.
func insert(ctx context.Context, t testing.TB, db *testenv.DB, w plainWriter, app string, r plainRow) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	if w == pgxWriter {
		conn := connectApp(ctx, t, db, app)
		go func() {
			defer conn.Close(context.Background())
			_, err := conn.Exec(ctx, r.insertSQL())
			done <- err
		}()
		return done
	}
	cmd := psql(t, db, app, "-c", r.insertSQL())
	go func() {
		if out, err := cmd.CombinedOutput(); err != nil {
			done <- fmt.Errorf("psql: %v: %s", err, out)
			return
		}
		done <- nil
	}()
	return done
}

// lateCommit reproduces the interleaving that breaks order without a database-enforced lock:
// T1 (first) inserts a and keeps its transaction open; T2 (second) inserts b, which is ordered
// after a, and commits at once. T1 commits only when T2 is seen waiting for a lock (the outbox
// serialises the two), or when T2 committed and the relay published b (it did not).
func lateCommit(ctx context.Context, t testing.TB, db *testenv.DB, first, second plainWriter, a, b plainRow) {
	t.Helper()
	app := "keiro-test-" + b.id
	t1 := begin(ctx, t, db, first, "keiro-test-"+a.id, a)
	done := insert(ctx, t, db, second, app, b)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	committed := false
	for {
		var blocked, sent bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT
            EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'),
            EXISTS (SELECT 1 FROM keiro_outbox WHERE message_id = $2 AND status = 'sent')`, app, b.id).Scan(&blocked, &sent))
		if blocked || sent {
			break
		}
		select {
		case err := <-done:
			require.NoError(t, err, "T2 (%s) inserting %s", second, b.id)
			committed = true
			done = nil // the relay publishing b is what is awaited now
		case <-tick.C:
		case <-deadline:
			t.Fatalf("T2 (%s) inserting %s neither waited for T1 nor was published", second, b.id)
		}
	}
	require.NoError(t, t1.commit(), "T1 (%s) committing %s", first, a.id)
	if !committed {
		require.NoError(t, <-done, "T2 (%s) inserting %s", second, b.id)
	}
}

// noise runs producers that write rows of keys (nil for a null key) with plain INSERTs,
// rows each, holding each transaction open for up to 3 ms, and returns how many rows they
// wrote once all committed.
func noise(ctx context.Context, t testing.TB, db *testenv.DB, source, topic string, producers, rows int, keys []*string) int {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rows {
				r := plainRow{id: fmt.Sprintf("noise-%d-%d", p, i), source: source, topic: topic,
					key: keys[rand.IntN(len(keys))], i: i}
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, r.insertSQL()); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "SELECT pg_sleep($1)", rand.Float64()*0.003)
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("noise producer %d row %d: %w", p, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return producers * rows
}

// seqInversions reads records and counts, per group (the source, or the source and key; null
// keys are unordered per key and skipped then), each record whose outbox seq is below the
// previous one of its group on Kafka. Duplicates (same message id) are dropped. It returns the
// distinct count, the inversions and a description of the first ones.
func seqInversions(t testing.TB, db *testenv.DB, recs []*kgo.Record, perSource bool) (distinct, inversions int, report string) {
	t.Helper()
	seqs := map[string]int64{}
	rows, err := db.Pool.Query(context.Background(), "SELECT message_id, seq FROM keiro_outbox")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var seq int64
		require.NoError(t, rows.Scan(&id, &seq))
		seqs[id] = seq
	}
	require.NoError(t, rows.Err())
	seen := map[string]bool{}
	last := map[string]int64{}
	var b strings.Builder
	for _, r := range recs {
		hs := make([]envelope.Header, len(r.Headers))
		for i, h := range r.Headers {
			hs[i] = envelope.Header{Key: h.Key, Value: h.Value}
		}
		e, err := envelope.Decode(envelope.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp})
		require.NoError(t, err)
		if seen[e.MessageID] {
			continue
		}
		seen[e.MessageID] = true
		group := e.Source
		if !perSource {
			if e.Key == nil {
				continue
			}
			group += "/" + *e.Key
		}
		seq, ok := seqs[e.MessageID]
		require.True(t, ok, "record %s has no outbox row", e.MessageID)
		if prev, ok := last[group]; ok && seq < prev {
			inversions++
			if inversions <= 5 {
				fmt.Fprintf(&b, "%s: seq %d (%s) after seq %d; ", group, seq, e.MessageID, prev)
			}
		}
		last[group] = seq
	}
	return len(seen), inversions, b.String()
}

// TestPlainSQLProducersKeepKeyOrder: producers that write the outbox with a plain INSERT (pgx
// without EnqueueTx, and psql) get per-key order from the database itself. For each key a
// transaction inserts the key's earlier row and commits late, while another inserts its later
// row and commits at once (every pairing of pgx and psql), with other plain-SQL producers
// writing shared keys meanwhile and a relay running: Kafka must hold every key in seq order.
func TestPlainSQLProducersKeepKeyOrder(t *testing.T) {
	t.Parallel()
	db, kc, _ := rig(t, 3)
	dumpOutboxOnFailure(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{PollInterval: 10 * time.Millisecond, OnBatch: onSettled(p), Logger: testLogger(t)})

	pairings := [][2]plainWriter{{pgxWriter, pgxWriter}, {psqlWriter, pgxWriter}, {pgxWriter, psqlWriter}, {psqlWriter, psqlWriter}}
	const rounds = 2
	var wg sync.WaitGroup
	for k, pw := range pairings {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("late-%d", k)
			for r := range rounds {
				row := func(i int) plainRow {
					return plainRow{id: fmt.Sprintf("%s-%d", key, i), source: "ordering", topic: "orders", key: &key, i: i}
				}
				lateCommit(ctx, t, db, pw[0], pw[1], row(2*r), row(2*r+1))
			}
		}()
	}
	n := noise(ctx, t, db, "ordering", "orders", 4, 25, []*string{ptr("n0"), ptr("n1"), ptr("n2"), nil})
	wg.Wait()
	n += len(pairings) * rounds * 2

	p.Wait(t, int64(n), 60*time.Second, nil)
	recs := kc.ConsumeRecords(t, n, 30*time.Second, "orders")
	distinct, inversions, report := seqInversions(t, db, recs, false)
	require.Equal(t, n, distinct)
	require.Zero(t, inversions, "per-key inversions on Kafka: %s", report)
}

// TestPerSourceStreamDeclaredSourceOrder: a source declared per-source is one ordered stream
// for every writer. Plain-SQL producers (pgx and psql) write rows of mixed keys, null keys
// included, where a row written first commits late while a row of another key (or none) is
// inserted and committed meanwhile, with other producers writing the source at the same time
// and a PerSourceStream relay running: the source's records on its single-partition topic
// must be in seq order.
func TestPerSourceStreamDeclaredSourceOrder(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	dumpOutboxOnFailure(t, db)
	kc.CreateTopic(t, "ledger", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, outbox.AdminOf(st).DeclarePerSourceOrder(ctx, db.Pool, "ledger"))
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{Policy: outbox.PerSourceStream, PollInterval: 10 * time.Millisecond,
		OnBatch: onSettled(p), Logger: testLogger(t)})

	keys := [][2]*string{{nil, nil}, {nil, ptr("x")}, {ptr("a"), ptr("b")}, {ptr("c"), nil}}
	pairings := [][2]plainWriter{{pgxWriter, pgxWriter}, {psqlWriter, pgxWriter}, {pgxWriter, psqlWriter}, {psqlWriter, psqlWriter}}
	done := make(chan struct{})
	var n int
	go func() {
		defer close(done)
		n = noise(ctx, t, db, "ledger", "ledger", 3, 20, []*string{ptr("a"), ptr("x"), nil})
	}()
	for k, ks := range keys {
		row := func(i int) plainRow {
			return plainRow{id: fmt.Sprintf("late-%d-%d", k, i), source: "ledger", topic: "ledger", key: ks[i], i: i}
		}
		lateCommit(ctx, t, db, pairings[k][0], pairings[k][1], row(0), row(1))
	}
	<-done
	n += 2 * len(keys)

	p.Wait(t, int64(n), 60*time.Second, nil)
	recs := kc.ConsumeRecords(t, n, 30*time.Second, "ledger")
	distinct, inversions, report := seqInversions(t, db, recs, true)
	require.Equal(t, n, distinct)
	require.Zero(t, inversions, "per-source inversions on Kafka: %s", report)
}

// TestDeclaringASourceWaitsForRunningWriters: a declaration changes the lock a source's writers
// take, so it must not overlap a writer still running under the old rule: it waits until that
// writer commits. Declaring twice does not wait; revoking restores per-key locks; bad input
// is refused.
func TestDeclaringASourceWaitsForRunningWriters(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	writer := begin(ctx, t, db, pgxWriter, "keiro-test-writer", plainRow{id: "w", source: "ledger", topic: "ledger", i: 0})
	conn := connectApp(ctx, t, db, "keiro-test-declare")
	defer conn.Close(ctx)
	done := make(chan error, 1)
	go func() { done <- outbox.AdminOf(st).DeclarePerSourceOrder(ctx, conn, "ledger", "ledger") }()
	for {
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
            WHERE application_name = 'keiro-test-declare' AND wait_event_type = 'Lock')`).Scan(&waiting))
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the declaration committed while a writer of the outbox was running (err %v)", err)
		default:
		}
	}
	require.NoError(t, writer.commit())
	require.NoError(t, <-done)
	got, err := outbox.AdminOf(st).PerSourceOrdered(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []string{"ledger"}, got)

	// Already declared: nothing to change, so no wait behind a running writer.
	writer = begin(ctx, t, db, pgxWriter, "keiro-test-writer2", plainRow{id: "w2", source: "other", topic: "ledger", i: 0})
	require.NoError(t, outbox.AdminOf(st).DeclarePerSourceOrder(ctx, db.Pool, "ledger"))
	require.NoError(t, writer.commit())

	require.NoError(t, outbox.AdminOf(st).RevokePerSourceOrder(ctx, db.Pool, "ledger"))
	got, err = outbox.AdminOf(st).PerSourceOrdered(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, got)

	require.ErrorContains(t, outbox.AdminOf(st).DeclarePerSourceOrder(ctx, db.Pool), "no source given")
	require.ErrorContains(t, outbox.AdminOf(st).DeclarePerSourceOrder(ctx, db.Pool, "a", ""), "source 1 is empty")
	require.ErrorContains(t, outbox.AdminOf(st).RevokePerSourceOrder(ctx, db.Pool), "no source given")
}

// sqlEnqueue calls <schema>.enqueue with named arguments, the way another language does.
func sqlEnqueue(ctx context.Context, q keiro.DB, schema string, args pgx.NamedArgs) (id [16]byte, outcome string, err error) {
	names := make([]string, 0, len(args))
	for k := range args {
		names = append(names, k+" => @"+k)
	}
	err = q.QueryRow(ctx, "SELECT outbox_id, outcome FROM "+schema+".enqueue("+strings.Join(names, ", ")+")", args).Scan(&id, &outcome)
	return id, outcome, err
}

// TestSQLEnqueueAnswersLikeEnqueueTx: <schema>.enqueue, the cross-language API, inserts, reports
// an identical retry as a duplicate and a changed event as an identity conflict naming the same
// field classes as EnqueueTx, agrees with EnqueueTx about rows the other wrote, refuses invalid
// input, and wakes a sleeping relay.
func TestSQLEnqueueAnswersLikeEnqueueTx(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	st, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ev := event("m1", "orders", ptr("k1"), `{"i":1}`)
	args := func(e envelope.Event) pgx.NamedArgs {
		return pgx.NamedArgs{"source": e.Source, "message_id": e.MessageID, "destination": e.Destination,
			"event_type": e.EventType, "payload": e.Payload, "occurred_at": e.OccurredAt,
			"message_key": e.Key, "content_type": e.ContentType}
	}

	id, outcome, err := sqlEnqueue(ctx, db.Pool, db.Schema, args(ev))
	require.NoError(t, err)
	require.Equal(t, "inserted", outcome)
	row, err := outbox.AdminOf(st).Lookup(ctx, db.Pool, envelope.UUID(id))
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, row.Status)
	id2, outcome, err := sqlEnqueue(ctx, db.Pool, db.Schema, args(ev))
	require.NoError(t, err)
	require.Equal(t, "duplicate", outcome)
	require.Equal(t, id, id2)
	res := enqueue(t, db.Pool, st, ev)
	require.Equal(t, outbox.Duplicate, res[0].Outcome, "EnqueueTx sees the SQL row as the same event")
	require.Equal(t, envelope.UUID(id), res[0].OutboxID)

	// A changed event: both APIs name the same differing fields.
	changed := ev
	changed.Payload = []byte(`{"i":2}`)
	changed.OccurredAt = ev.OccurredAt.Add(time.Second)
	changed.Key = ptr("k2")
	_, _, err = sqlEnqueue(ctx, db.Pool, db.Schema, args(changed))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.Equal(t, "conflicting fields: routing,payload,occurred_at", pgErr.Detail)
	require.Contains(t, pgErr.Message, `message "m1" of source "ordering" already enqueued with different routing, payload, occurred_at`)
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { _, err := st.EnqueueTx(ctx, tx, changed); return err })
	var conflict *outbox.IdentityConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, []string{"routing", "payload", "occurred_at"}, conflict.Fields)

	// A row EnqueueTx wrote, retried through SQL.
	ev2 := event("m2", "orders", nil, `{"i":3}`)
	ev2.Attributes = []byte(`{"tenant":"t1","n":1}`)
	ev2.TraceContext = &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "a=b"}
	res = enqueue(t, db.Pool, st, ev2)
	a2 := args(ev2)
	a2["attributes"] = `{"n": 1, "tenant": "t1"}`
	a2["traceparent"], a2["tracestate"] = ev2.TraceContext.Traceparent, ev2.TraceContext.Tracestate
	id, outcome, err = sqlEnqueue(ctx, db.Pool, db.Schema, a2)
	require.NoError(t, err)
	require.Equal(t, "duplicate", outcome)
	require.Equal(t, res[0].OutboxID, envelope.UUID(id))
	a2["tracestate"] = "a=c"
	_, _, err = sqlEnqueue(ctx, db.Pool, db.Schema, a2)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "conflicting fields: trace", pgErr.Detail)

	// Invalid input: every problem named, nothing written.
	bad := args(event("", "no topic", nil, "{}"))
	bad["traceparent"] = "00-zz"
	bad["schema_version"] = -1
	_, _, err = sqlEnqueue(ctx, db.Pool, db.Schema, bad)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)
	for _, want := range []string{"message_id is required", "destination is not a legal Kafka topic",
		"traceparent is not a W3C traceparent", "schema_version must be 0 or more"} {
		require.Contains(t, pgErr.Message, want)
	}
	nullPayload := args(event("m3", "orders", nil, "{}"))
	nullPayload["payload"] = nil
	_, _, err = sqlEnqueue(ctx, db.Pool, db.Schema, nullPayload)
	require.ErrorContains(t, err, "payload is required")

	// A sleeping relay is woken at commit; an awake one is not.
	notifications := listen(t, ctx, db, st)
	sleeper, err := pgx.Connect(ctx, db.ConnString)
	require.NoError(t, err)
	defer sleeper.Close(ctx)
	_, _, err = sqlEnqueue(ctx, db.Pool, db.Schema, args(event("awake", "orders", nil, "{}")))
	require.NoError(t, err)
	require.Empty(t, notifications())
	var slept bool
	require.NoError(t, sleeper.QueryRow(ctx, sleepLockSQL, db.Schema).Scan(&slept))
	require.True(t, slept)
	_, _, err = sqlEnqueue(ctx, db.Pool, db.Schema, args(event("asleep", "orders", nil, "{}")))
	require.NoError(t, err)
	require.Equal(t, []string{""}, notifications())
	// So is a relay restricted to some destinations (the function repeats the relay's two
	// sleep-lock keys; this keeps them in step).
	_, err = sleeper.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	require.NoError(t, sleeper.QueryRow(ctx, sleepLockFilteredSQL, db.Schema).Scan(&slept))
	require.True(t, slept)
	_, _, err = sqlEnqueue(ctx, db.Pool, db.Schema, args(event("asleep-filtered", "orders", nil, "{}")))
	require.NoError(t, err)
	require.Equal(t, []string{""}, notifications())
}
