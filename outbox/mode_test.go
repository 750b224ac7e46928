package outbox_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

// dropLogSlot drops a test's slot and publication when it ends (a slot left behind keeps WAL).
// Before that it drops the slots of earlier runs that ended without their cleanup (a test
// binary killed by its -timeout): inactive slots of a test schema's name that keep more than
// 1 GiB of WAL.
func dropLogSlot(t *testing.T, pool *pgxpool.Pool, name string) {
	if _, err := pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE NOT active AND slot_name ~ '^t_[0-9a-f]{12}_keiro_log$'
		  AND pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) > 1073741824`); err != nil {
		t.Logf("sweep abandoned test slots: %v", err)
	}
	t.Cleanup(func() {
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
			time.Sleep(50 * time.Millisecond) // a terminated reader releases its slot shortly after
		}
		if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+name); err != nil {
			t.Errorf("drop publication %s: %v", name, err)
		}
	})
}

// count reads a table's row count.
func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// A schema switched claim → log → claim loses nothing and keeps every key's order: the rows
// pending in keiro_outbox at the switch to log are published first by the log-mode relay,
// the rows written in log mode come from the slot, and the claim relay publishes what is
// written after the switch back. The producer API is the same throughout, and so is
// idempotent enqueue, across the two tables.
func TestModeSwitchClaimLogClaimLosesNothing(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 4)
	ctx := context.Background()
	slot := outbox.DefaultLogSlot(db.Schema)
	dropLogSlot(t, db.Pool, slot)
	evs := keyedEvents("orders", 150, 7)

	mode, err := outbox.AdminOf(st).Mode(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, outbox.ModeClaim, mode)
	enqueue(t, db.Pool, st, evs[:50]...) // pending in keiro_outbox when the log relay starts

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	logRelay, stopLog := startRelay(t, db, kc, outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine, PollInterval: 50 * time.Millisecond,
		MeterProvider: mp, Logger: testLogger(t)})
	testenv.WaitFor(t, time.Minute, "the log-mode relay switched the schema", func() bool {
		m, err := outbox.AdminOf(st).Mode(ctx, db.Pool)
		return err == nil && m == outbox.ModeLog
	})
	res := enqueue(t, db.Pool, st, evs[50:99]...)
	require.Equal(t, outbox.Inserted, res[0].Outcome)
	var outcome string
	e99 := evs[99]
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT outcome FROM enqueue(source => $1, message_id => $2,
		destination => $3, event_type => $4, payload => $5, occurred_at => $6, message_key => $7)`,
		e99.Source, e99.MessageID, e99.Destination, e99.EventType, e99.Payload, e99.OccurredAt, *e99.Key).Scan(&outcome))
	require.Equal(t, "inserted", outcome, "<schema>.enqueue in log mode")

	// Idempotent enqueue across the tables: a claim-mode event and a log-mode event enqueued
	// again are duplicates; changed content is an identity conflict.
	res = enqueue(t, db.Pool, st, evs[3], evs[60])
	require.Equal(t, []outbox.EnqueueOutcome{outbox.Duplicate, outbox.Duplicate}, []outbox.EnqueueOutcome{res[0].Outcome, res[1].Outcome})
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT outcome FROM enqueue(source => $1, message_id => $2,
		destination => $3, event_type => $4, payload => $5, occurred_at => $6, message_key => $7)`,
		e99.Source, e99.MessageID, e99.Destination, e99.EventType, e99.Payload, e99.OccurredAt, *e99.Key).Scan(&outcome))
	require.Equal(t, "duplicate", outcome)
	changed := evs[60]
	changed.Payload = []byte(`{"changed":true}`)
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(ctx, tx, changed)
		return err
	})
	require.ErrorIs(t, err, outbox.ErrIdentityConflict)

	recs := kc.ConsumeRecords(t, 100, time.Minute, "orders")
	distinct, dups := checkOrder(t, recs)
	require.Equal(t, 100, distinct)
	require.Zero(t, dups)
	require.Equal(t, 50, count(t, db.Pool, "keiro_outbox"))
	require.Equal(t, 50, count(t, db.Pool, "keiro_outbox_log"))
	require.Equal(t, int64(100), logRelay.Stats().Published)

	// The WAL guard: the slot's state in LogSlotStatus (relay status) and in the gauges.
	ss, err := outbox.AdminOf(st).LogSlotStatus(ctx, db.Pool, "")
	require.NoError(t, err)
	require.True(t, ss.Exists)
	require.Positive(t, ss.ActivePID, "the log-mode relay reads the slot")
	require.Contains(t, []string{"reserved", "extended"}, ss.WALStatus)
	require.NotEmpty(t, ss.ConfirmedFlushLSN)
	var sysID, dbName string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT system_identifier::text, current_database() FROM pg_control_system()`).Scan(&sysID, &dbName))
	require.Equal(t, "keiro-relay-log."+sysID+"."+dbName+"."+ss.Slot, ss.TransactionalID,
		"the slot's transactional id under ExactlyOnce")
	got := collectMetrics(t, reader)
	active, ok := got[outbox.MetricLogSlotActive].(metricdata.Gauge[int64])
	require.True(t, ok, "the slot's active gauge")
	require.EqualValues(t, 1, active.DataPoints[0].Value)
	retained, ok := got[outbox.MetricLogSlotRetained].(metricdata.Gauge[int64])
	require.True(t, ok, "the slot's retained-WAL gauge")
	require.GreaterOrEqual(t, retained.DataPoints[0].Value, int64(0))
	slotAttr, _ := retained.DataPoints[0].Attributes.Value("keiro.outbox.slot")
	require.Equal(t, slot, slotAttr.AsString())

	// Back to claim: the log-mode relay has published the slot's rows once its confirmed
	// position reaches the switch's LSN; then the claim relay takes over.
	ch, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeClaim, "")
	require.NoError(t, err)
	require.Equal(t, outbox.ModeLog, ch.From)
	testenv.WaitFor(t, time.Minute, "the slot confirmed the switch back", func() bool {
		var done bool
		err := db.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
			slot, ch.LSN).Scan(&done)
		return err == nil && done
	})
	stopLog()
	res = enqueue(t, db.Pool, st, evs[100:]...)
	require.Equal(t, outbox.Inserted, res[0].Outcome)
	res = enqueue(t, db.Pool, st, evs[70])
	require.Equal(t, outbox.Duplicate, res[0].Outcome, "a log-mode event enqueued again in claim mode")
	startRelay(t, db, kc, outbox.RelayConfig{Logger: testLogger(t)})
	recs = kc.ConsumeRecords(t, 150, time.Minute, "orders")
	distinct, dups = checkOrder(t, recs)
	require.Equal(t, 150, distinct)
	require.Zero(t, dups)
	require.Equal(t, 100, count(t, db.Pool, "keiro_outbox"))
}

// RelayConfig.Mode and LogSlot are validated with the rest of the configuration.
func TestRelayConfigModeValidation(t *testing.T) {
	t.Parallel()
	db, kc, _ := rig(t, 1)
	client := kc.NewClient(t, outbox.ProducerOpts()...)
	_, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, Mode: "wal"})
	require.ErrorContains(t, err, `Mode: mode "wal": want claim or log`)
	_, err = outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, LogSlot: "s"})
	require.ErrorContains(t, err, `LogSlot "s" is set but Mode is claim`)
	_, err = outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, Mode: outbox.ModeLog, LogEngine: logrelay.Engine, LogSlot: "Bad-Slot"})
	require.ErrorContains(t, err, `Slot "Bad-Slot"`)
	_, err = outbox.AdminOf(st(t)).SetMode(context.Background(), db.Pool, outbox.ModeLog, "Bad-Slot")
	require.ErrorContains(t, err, `slot "Bad-Slot"`)
	_, err = outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, Mode: outbox.ModeLog, LogEngine: logrelay.Engine, Destinations: []string{"orders"}})
	require.NoError(t, err, "log mode with Destinations: a relay of its own slot")
	_, err = outbox.NewRelay(db.Pool, client, outbox.RelayConfig{Schema: db.Schema, Mode: outbox.ModeLog, LogEngine: logrelay.Engine, Destinations: []string{"orders", ""}})
	require.ErrorContains(t, err, `Destinations[1] "" is empty`)
	_, _, err = outbox.AdminOf(st(t)).PrepareLogSlot(context.Background(), db.Pool, "", []string{"orders", "a b"})
	require.ErrorContains(t, err, `destinations[0] "a b" is not a legal Kafka topic`)
	_, err = outbox.ParseMode("Log")
	require.Error(t, err)
	_, err = outbox.AdminOf(st(t)).SetMode(context.Background(), db.Pool, "wal", "")
	require.Error(t, err)
}

// logModeRig is rig with the schema switched to log mode (its slot dropped when t ends).
func logModeRig(t *testing.T) (*testenv.DB, *outbox.Store) {
	t.Helper()
	db, _, st := rig(t, 1)
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	_, err := outbox.AdminOf(st).SetMode(context.Background(), db.Pool, outbox.ModeLog, "")
	require.NoError(t, err)
	return db, st
}

func st(t *testing.T) *outbox.Store {
	s, err := outbox.NewStore("keiro")
	require.NoError(t, err)
	return s
}

// In log mode, an event enqueued again with the same caller-chosen outbox id (the events
// layer's deterministic ids) is a duplicate when identical and a conflict when changed, as in
// claim mode.
func TestLogModeEnqueueWithIDs(t *testing.T) {
	t.Parallel()
	db, st := logModeRig(t)
	ctx := context.Background()
	id := envelope.NewUUIDv7()
	ev := event("m-1", "orders", ptr("k"), `{"n":1}`)
	enq := func(e envelope.Event) ([]outbox.EnqueueResult, error) {
		var res []outbox.EnqueueResult
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			res, err = st.EnqueueWithIDsTx(ctx, tx, []envelope.UUID{id}, e)
			return err
		})
		return res, err
	}
	res, err := enq(ev)
	require.NoError(t, err)
	require.Equal(t, outbox.Inserted, res[0].Outcome)
	res, err = enq(ev)
	require.NoError(t, err)
	require.Equal(t, outbox.Duplicate, res[0].Outcome)
	require.Equal(t, id, res[0].OutboxID)
	ev.Payload = []byte(`{"n":2}`)
	_, err = enq(ev)
	require.ErrorIs(t, err, outbox.ErrIdentityConflict)
	require.Equal(t, 1, count(t, db.Pool, "keiro_outbox_log"))
	require.Zero(t, count(t, db.Pool, "keiro_outbox"))
}

// In log mode a plain INSERT (or <schema>.enqueue) of an event already in keiro_outbox_log
// writes nothing when it is the same event, and raises unique_violation naming the changed
// fields when it is not, as a duplicate INSERT into keiro_outbox does in claim mode: a changed
// event is never dropped in silence.
func TestLogModeInsertOfAChangedDuplicateIsAConflict(t *testing.T) {
	t.Parallel()
	db, _ := logModeRig(t)
	ctx := context.Background()
	insert := func(payload, traceparent string) error {
		var tp *string
		if traceparent != "" {
			tp = &traceparent
		}
		_, err := db.Pool.Exec(ctx, `INSERT INTO keiro_outbox (outbox_id, message_id, source, destination,
			message_key, event_type, schema_version, content_type, payload_bytes, occurred_at, traceparent)
			VALUES (gen_random_uuid(), 'm-1', 'orders-svc', 'orders', 'k', 'OrderPlaced', 1, 'application/json',
			$1::bytea, '2026-12-01T00:00:00Z', $2)`, []byte(payload), tp)
		return err
	}
	const tp1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	require.NoError(t, insert(`{"n":1}`, tp1))
	require.NoError(t, insert(`{"n":1}`, tp1), "the same event again")
	require.NoError(t, insert(`{"n":1}`, ""), "a retry without a trace is the same event")
	require.Equal(t, 1, count(t, db.Pool, "keiro_outbox_log"))

	err := insert(`{"n":2}`, tp1)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.Equal(t, "keiro_outbox_source_message_id_key", pgErr.ConstraintName)
	require.Equal(t, "conflicting fields: payload", pgErr.Detail)
	require.Contains(t, pgErr.Message, `message "m-1" of source "orders-svc" already enqueued with different payload`)

	err = insert(`{"n":1}`, "00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "conflicting fields: trace", pgErr.Detail)

	// <schema>.enqueue answers the same conflict.
	err = db.Pool.QueryRow(ctx, `SELECT outcome FROM enqueue(source => 'orders-svc', message_id => 'm-1',
		destination => 'orders', event_type => 'OrderPlaced', payload => '{"n":3}'::bytea,
		occurred_at => '2026-12-01T00:00:00Z', message_key => 'k', schema_version => 1)`).Scan(new(string))
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.Equal(t, "conflicting fields: payload", pgErr.Detail)
	require.Equal(t, 1, count(t, db.Pool, "keiro_outbox_log"))
	require.Zero(t, count(t, db.Pool, "keiro_outbox"))
}

// Switches of the mode while producers write: several relays switching at once (each starts
// with --mode=log) and back, under producers writing several statements per transaction through
// EnqueueTx and plain INSERTs. No switch and no producer fails (no deadlock, no duplicate
// publication), every event lands in exactly one table, and the later of concurrent switches
// to one mode change nothing.
func TestConcurrentSwitchesUnderProducers(t *testing.T) {
	t.Parallel()
	db, _, st := rig(t, 1)
	ctx := context.Background()
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	var written atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("w%d", w)
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					for j := range 3 {
						id := fmt.Sprintf("w%d-%d-%d", w, i, j)
						if w%2 == 0 {
							if _, err := st.EnqueueTx(ctx, tx, event(id, "orders", &k, `{"i":0}`)); err != nil {
								return err
							}
							continue
						}
						if _, err := tx.Exec(ctx, `INSERT INTO keiro_outbox (outbox_id, message_id, source, destination,
							message_key, event_type, schema_version, content_type, payload_bytes, occurred_at)
							VALUES (gen_random_uuid(), $1, 'ordering', 'orders', $2, 'OrderPlaced', 0, 'application/json', '\x7b7d', now())`,
							id, k); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- fmt.Errorf("producer %d: %w", w, err)
					return
				}
				written.Add(3)
			}
		}()
	}
	for _, mode := range []outbox.Mode{outbox.ModeLog, outbox.ModeClaim, outbox.ModeLog} {
		var sw sync.WaitGroup
		changed := atomic.Int64{}
		for range 3 {
			sw.Add(1)
			go func() {
				defer sw.Done()
				ch, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, mode, "")
				if err != nil {
					errs <- fmt.Errorf("switch to %s: %w", mode, err)
					return
				}
				if ch.From != ch.To {
					changed.Add(1)
				}
			}()
		}
		sw.Wait()
		require.EqualValues(t, 1, changed.Load(), "one of the concurrent switches to %s changes the mode", mode)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Positive(t, written.Load())
	require.EqualValues(t, written.Load(), count(t, db.Pool, "keiro_outbox")+count(t, db.Pool, "keiro_outbox_log"))
	// No transaction wrote under both modes: each one's three events are in one table.
	var split []string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(tx), '{}') FROM (
		SELECT regexp_replace(message_id, '-[0-9]+$', '') AS tx, count(DISTINCT t) AS tables FROM (
			SELECT message_id, 'claim' AS t FROM keiro_outbox UNION ALL SELECT message_id, 'log' FROM keiro_outbox_log) r
		GROUP BY 1) x WHERE tables > 1`).Scan(&split))
	require.Empty(t, split, "transactions that wrote under both modes")
}

// One event (bound as scalars) and several (bound as arrays) write the same row, in either
// mode, every envelope field included; in log mode an event already in keiro_outbox (enqueued
// in claim mode) is a duplicate, alone or in a batch, and writes nothing to keiro_outbox_log.
func TestEnqueueOneAndManyWriteTheSameRowInBothModes(t *testing.T) {
	t.Parallel()
	db, _, st := rig(t, 1)
	ctx := context.Background()
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	uuids := []envelope.UUID{envelope.NewUUIDv7(), envelope.NewUUIDv7(), envelope.NewUUIDv7()}
	full := func(id string) envelope.Event {
		e := event(id, "orders", ptr("k1"), `{"n":1}`)
		e.SchemaVersion = 3
		e.SchemaRef = &envelope.SchemaRef{Registry: ptr("reg"), Subject: ptr("orders-value"), Version: ptr(int64(4)),
			SchemaID: ptr(int64(17)), Fingerprint: ptr("sha256:ab")}
		src, causation, correlation := uuids[0], uuids[1], uuids[2]
		e.SourceEventID, e.CausationID, e.CorrelationID = &src, &causation, &correlation
		e.SourceGlobalPosition = ptr(int64(42))
		e.TraceContext = &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "k=v"}
		e.Attributes = []byte(`{"tenant": "t1"}`)
		return e
	}
	// The row's columns but its identity (message id, outbox id) and state, as one value.
	const envelopeOf = `SELECT to_jsonb(r) - 'outbox_id' - 'message_id' - 'created_at' FROM (
		SELECT outbox_id, message_id, source, destination, message_key, event_type, schema_version,
		    content_type, schema_registry, schema_subject, schema_version_ref, schema_id,
		    schema_fingerprint, source_event_id, source_global_position, causation_id, correlation_id,
		    traceparent, tracestate, payload_bytes, attributes, occurred_at, NULL AS created_at
		FROM %s WHERE message_id = $1) r`
	rowOf := func(table, id string) string {
		t.Helper()
		var s string
		require.NoError(t, db.Pool.QueryRow(ctx, fmt.Sprintf(envelopeOf, table), id).Scan(&s))
		return s
	}

	enqueue(t, db.Pool, st, full("claim-one"))
	enqueue(t, db.Pool, st, full("claim-many-1"), full("claim-many-2"))
	want := rowOf("keiro_outbox", "claim-one")
	for _, v := range []string{`"reg"`, `"orders-value"`, `"sha256:ab"`, `"k=v"`, `"t1"`, `42`, `17`, uuids[2].String()} {
		require.Contains(t, want, v) // every field is set, so a field one path drops shows
	}
	require.Equal(t, want, rowOf("keiro_outbox", "claim-many-1"))

	_, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeLog, "")
	require.NoError(t, err)
	res := enqueue(t, db.Pool, st, full("log-one"))
	require.Equal(t, outbox.Inserted, res[0].Outcome)
	res = enqueue(t, db.Pool, st, full("log-many-1"), full("log-many-2"))
	require.Equal(t, []outbox.EnqueueOutcome{outbox.Inserted, outbox.Inserted}, []outbox.EnqueueOutcome{res[0].Outcome, res[1].Outcome})
	require.Equal(t, want, rowOf("keiro_outbox_log", "log-one"))
	require.Equal(t, want, rowOf("keiro_outbox_log", "log-many-2"))

	res = enqueue(t, db.Pool, st, full("claim-one"))
	require.Equal(t, outbox.Duplicate, res[0].Outcome)
	res = enqueue(t, db.Pool, st, full("claim-many-2"), full("log-many-3"), full("log-one"))
	require.Equal(t, []outbox.EnqueueOutcome{outbox.Duplicate, outbox.Inserted, outbox.Duplicate},
		[]outbox.EnqueueOutcome{res[0].Outcome, res[1].Outcome, res[2].Outcome})
	require.Equal(t, 4, count(t, db.Pool, "keiro_outbox_log"))
	require.Equal(t, 3, count(t, db.Pool, "keiro_outbox"))
}

// Once an enqueue found the schema in log mode, EnqueueTx writes with log mode's statement,
// which does not name keiro_outbox as an insert target: it takes keiro_outbox's ROW EXCLUSIVE
// lock with a LOCK TABLE in the same round trip, which the mode switch's fence waits for. A
// switch back to claim waits for a transaction that enqueued in log mode, and the first
// enqueue after it finds claim mode and writes keiro_outbox, in one call.
func TestLogModeEnqueueHoldsTheSwitchBack(t *testing.T) {
	t.Parallel()
	db, st := logModeRig(t)
	ctx := context.Background()
	enqueue(t, db.Pool, st, event("first", "orders", ptr("k"), `{}`))

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = st.EnqueueTx(ctx, tx, event("held", "orders", ptr("k"), `{}`), event("held-2", "orders", ptr("k"), `{}`))
	require.NoError(t, err)
	require.True(t, outbox.EnqueuesInLogMode(st), "the first call found log mode")

	switched := make(chan error, 1)
	go func() {
		_, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeClaim, "")
		switched <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks
			WHERE relation = 'keiro_outbox'::regclass AND mode = 'ShareLock' AND NOT granted)`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 10*time.Millisecond, "the switch waits for the log-mode transaction")
	select {
	case err := <-switched:
		t.Fatalf("the switch ended (%v) while a transaction that enqueued in log mode was open", err)
	default:
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-switched)

	res := enqueue(t, db.Pool, st, event("after", "orders", ptr("k"), `{}`))
	require.Equal(t, outbox.Inserted, res[0].Outcome)
	var table string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT 'keiro_outbox' FROM keiro_outbox WHERE message_id = 'after'
		UNION ALL SELECT 'keiro_outbox_log' FROM keiro_outbox_log WHERE message_id = 'after'`).Scan(&table))
	require.Equal(t, "keiro_outbox", table)
	require.Equal(t, 3, count(t, db.Pool, "keiro_outbox_log"))

	require.False(t, outbox.EnqueuesInLogMode(st), "the call found claim mode")
}

// A producer's role needs no more than SELECT and INSERT on the outbox's tables, and USAGE on
// its sequence, to enqueue in either mode, log mode's own statement included.
func TestProducerRoleEnqueuesInBothModes(t *testing.T) {
	t.Parallel()
	db, st := logModeRig(t)
	ctx := context.Background()
	role := "producer_" + db.Schema
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %[1]s;
		GRANT USAGE ON SCHEMA %[2]s TO %[1]s;
		GRANT SELECT, INSERT ON %[2]s.keiro_outbox, %[2]s.keiro_outbox_log TO %[1]s;
		GRANT SELECT ON %[2]s.keiro_outbox_settings, %[2]s.keiro_outbox_source TO %[1]s;
		GRANT USAGE ON SEQUENCE %[2]s.keiro_outbox_seq TO %[1]s`, role, db.Schema))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %[1]s; DROP ROLE %[1]s", role))
	})
	cfg := db.Pool.Config()
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+role)
		return err
	}
	producer, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(producer.Close)

	for i := range 3 { // the first call finds log mode, the next ones run log mode's statement
		res := enqueue(t, producer, st, event(fmt.Sprintf("log-%d", i), "orders", ptr("k"), `{}`),
			event(fmt.Sprintf("log-%d-b", i), "orders", ptr("k"), `{}`))
		require.Equal(t, outbox.Inserted, res[0].Outcome)
		res = enqueue(t, producer, st, event(fmt.Sprintf("log-%d-c", i), "orders", ptr("k"), `{}`))
		require.Equal(t, outbox.Inserted, res[0].Outcome)
	}
	require.True(t, outbox.EnqueuesInLogMode(st))
	_, err = outbox.AdminOf(st).SetMode(ctx, db.Pool, outbox.ModeClaim, "")
	require.NoError(t, err)
	for i := range 2 {
		res := enqueue(t, producer, st, event(fmt.Sprintf("claim-%d", i), "orders", ptr("k"), `{}`))
		require.Equal(t, outbox.Inserted, res[0].Outcome)
	}
	require.Equal(t, 9, count(t, db.Pool, "keiro_outbox_log"))
	require.Equal(t, 2, count(t, db.Pool, "keiro_outbox"))
}

// A call's payloads travel as one bytea and their spans: each row gets exactly its own bytes,
// empty, one byte, every byte value, large, in either mode, and with nil and empty payloads alike.
func TestEnqueueManyKeepsEachPayload(t *testing.T) {
	t.Parallel()
	db, _, st := rig(t, 1)
	ctx := context.Background()
	dropLogSlot(t, db.Pool, outbox.DefaultLogSlot(db.Schema))
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	payloads := [][]byte{nil, {}, {0}, every, bytes.Repeat([]byte{0xff, 0x00, 'x'}, 100_000), []byte(`{"n":1}`)}
	for _, mode := range []outbox.Mode{outbox.ModeClaim, outbox.ModeLog} {
		_, err := outbox.AdminOf(st).SetMode(ctx, db.Pool, mode, "")
		require.NoError(t, err)
		table := map[outbox.Mode]string{outbox.ModeClaim: "keiro_outbox", outbox.ModeLog: "keiro_outbox_log"}[mode]
		for round := range 2 { // the second call runs the statement of the mode the first one found
			events := make([]envelope.Event, len(payloads))
			for i, p := range payloads {
				events[i] = event(fmt.Sprintf("%s-%d-%d", mode, round, i), "orders", ptr("k"), "")
				events[i].ContentType = "application/octet-stream"
				events[i].Payload = p
			}
			res := enqueue(t, db.Pool, st, events...)
			for i := range events {
				require.Equal(t, outbox.Inserted, res[i].Outcome)
				var got []byte
				require.NoError(t, db.Pool.QueryRow(ctx, "SELECT payload_bytes FROM "+table+" WHERE message_id = $1",
					events[i].MessageID).Scan(&got))
				require.Equal(t, len(payloads[i]), len(got), "payload %d in %s", i, mode)
				require.True(t, bytes.Equal(payloads[i], got), "payload %d in %s", i, mode)
			}
		}
	}
}

// A slot is listed as soon as its creation starts, and reaches its consistent point only once
// the transactions running then have ended; it decodes only what commits after that. A switch
// to log mode that finds the slot being created by another session (a relay started at the
// same time) waits for that point, so no event written after the switch is missing from the
// slot.
func TestSwitchWaitsForASlotBeingCreated(t *testing.T) {
	t.Parallel()
	db, _, st := rig(t, 1)
	ctx := context.Background()
	slot := outbox.DefaultLogSlot(db.Schema)
	dropLogSlot(t, db.Pool, slot)
	blocker, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, "SELECT pg_catalog.txid_current()") // a running transaction the creation waits for
	require.NoError(t, err)

	created := make(chan error, 1)
	go func() {
		_, _, err := outbox.AdminOf(st).PrepareLogSlot(ctx, db.Pool, "", nil)
		created <- err
	}()
	require.Eventually(t, func() bool {
		var listed bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots
			WHERE slot_name = $1)`, slot).Scan(&listed))
		return listed
	}, 10*time.Second, 10*time.Millisecond, "the slot is listed while it is being created")

	other, err := outbox.NewStore(db.Schema) // another relay's
	require.NoError(t, err)
	waits := make(chan struct{}, 1)
	outbox.OnSlotWait(other, func() {
		select {
		case waits <- struct{}{}:
		default:
		}
	})
	switched := make(chan outbox.ModeChange, 1)
	go func() {
		ch, err := outbox.AdminOf(other).SetMode(ctx, db.Pool, outbox.ModeLog, "")
		assert.NoError(t, err)
		switched <- ch
	}()
	select {
	case <-waits:
	case ch := <-switched:
		t.Fatalf("switched to log mode (%+v) while the slot was being created", ch)
	}
	mode, err := outbox.AdminOf(st).Mode(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, outbox.ModeClaim, mode, "no switch before the slot is consistent")

	require.NoError(t, blocker.Rollback(ctx))
	require.NoError(t, <-created)
	ch := <-switched
	require.Equal(t, outbox.ModeLog, ch.To)
	require.False(t, ch.SlotCreated)
	var consistent bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn <= $2::pg_lsn FROM pg_catalog.pg_replication_slots
		WHERE slot_name = $1`, slot, ch.LSN).Scan(&consistent))
	require.True(t, consistent, "the slot was consistent before the switch")
}
