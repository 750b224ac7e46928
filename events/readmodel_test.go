package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The tests of this file port keiro's "Keiro.ReadModel" and "Keiro.Connection projection
// schema" cases. Their fixture is keiro's: a counter read model (counter_read_model) filled by
// an inline projection (row "inline") or an asynchronous one (row "async-idempotent").

type readModelBundle struct {
	db     *testenv.DB
	store  *events.Store
	runner *events.Runner[counterState, counterCmd, counterEvent]
	rms    *events.ReadModels
	tm     *telemetry
	model  events.ReadModel
	async  events.AsyncProjection
	ctx    context.Context
}

const createCounterReadModel = `CREATE TABLE IF NOT EXISTS %s (
    model_id        text PRIMARY KEY,
    amount          bigint NOT NULL,
    last_seen       bigint NOT NULL,
    source_event_id uuid,
    actor           text)`

// upsertCounter adds amount to row id of table.
func upsertCounter(ctx context.Context, tx pgx.Tx, table, id string, amount int, e events.RecordedEvent, actor *string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+table+` AS t (model_id, amount, last_seen, source_event_id, actor)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (model_id) DO UPDATE SET amount = t.amount + excluded.amount, last_seen = excluded.last_seen,
            source_event_id = excluded.source_event_id, actor = excluded.actor`,
		id, amount, e.GlobalPosition, [16]byte(e.ID), actor)
	return err
}

func addedAmount(t testing.TB, e events.RecordedEvent) int {
	var a Added
	require.NoError(t, json.Unmarshal(e.Data, &a))
	return a.N
}

// setupReadModel registers keiro's counter read model (unless register is false) over a new
// schema, with an inline projection hook on the runner.
func setupReadModel(t *testing.T, register bool) *readModelBundle {
	t.Helper()
	t.Parallel()
	b := &readModelBundle{db: testenv.NewDB(t), tm: newTelemetry(), ctx: context.Background()}
	b.model = events.ReadModel{
		Name: "counter-read-model", Schema: b.db.Schema, Table: "counter_read_model",
		Subscription: "counter-read-model-sub", Version: 1, ShapeHash: "counter-read-model-v1",
	}
	table := b.model.QualifiedTable()
	_, err := b.db.Pool.Exec(b.ctx, fmt.Sprintf(createCounterReadModel, table))
	require.NoError(t, err)
	inline := func(ctx context.Context, tx pgx.Tx, res events.Result) error {
		for _, e := range res.Events {
			if e.Category() != "counter" {
				continue
			}
			var meta struct {
				Actor *string `json:"actor"`
			}
			if len(e.Metadata.Extra) > 0 {
				if err := json.Unmarshal(e.Metadata.Extra, &meta); err != nil {
					return err
				}
			}
			if err := upsertCounter(ctx, tx, table, "inline", addedAmount(t, e), e, meta.Actor); err != nil {
				return err
			}
		}
		return nil
	}
	b.store, b.runner = newCounterRunner(t, b.db, b.tm, events.RunnerConfig[counterState]{Hooks: []events.Hook{inline}})
	b.rms, err = events.NewReadModels(b.store, b.db.Pool, events.ReadModelsConfig{MeterProvider: b.tm.mp})
	require.NoError(t, err)
	b.async = events.AsyncProjection{
		Name: "counter-async-projection", ReadModel: b.model.Name,
		Apply: func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
			return upsertCounter(ctx, tx, table, "async-idempotent", addedAmount(t, e), e, nil)
		},
	}
	if register {
		info, err := b.rms.Register(b.ctx, b.model)
		require.NoError(t, err)
		require.Equal(t, events.StatusLive, info.Status)
	}
	return b
}

// amount queries row id of the counter model with consistency c.
func (b *readModelBundle) amount(id string, c events.Consistency) (int64, error) {
	return b.amountOf(b.model, id, c)
}

func (b *readModelBundle) amountOf(m events.ReadModel, id string, c events.Consistency) (int64, error) {
	var n int64
	err := b.rms.Query(b.ctx, m, c, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT coalesce((SELECT amount FROM `+m.QualifiedTable()+` WHERE model_id = $1), 0)`, id).Scan(&n)
	})
	return n, err
}

// run runs the counter command Add n on stream and returns its result.
func (b *readModelBundle) run(t *testing.T, stream string, n int, opts ...events.RunOptions) events.Result {
	t.Helper()
	res, err := b.runner.Run(b.ctx, b.db.Pool, stream, counterCmd{N: n}, opts...)
	require.NoError(t, err)
	return res
}

// setCheckpoint moves the model's subscription checkpoint, as keiro's tests upsert the cursor.
func (b *readModelBundle) setCheckpoint(t *testing.T, position int64) {
	t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO keiro_subscriptions (name, position) VALUES ($1, $2)
        ON CONFLICT (name) DO UPDATE SET position = excluded.position`, b.model.Subscription, position)
	require.NoError(t, err)
}

// only returns the single event of stream.
func (b *readModelBundle) only(t *testing.T, stream string) events.RecordedEvent {
	t.Helper()
	evs := collect(t, b.store.ReadStream(b.ctx, b.db.Pool, stream, events.Forward, 0))
	require.Len(t, evs, 1)
	return evs[0]
}

// apply runs ApplyTx (or ApplyUnfencedTx) in its own transaction.
func (b *readModelBundle) apply(t *testing.T, p events.AsyncProjection, e events.RecordedEvent, unfenced bool) events.AsyncOutcome {
	t.Helper()
	var o events.AsyncOutcome
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		if unfenced {
			o, err = b.rms.ApplyUnfencedTx(b.ctx, tx, p, e)
		} else {
			o, err = b.rms.ApplyTx(b.ctx, tx, p, e)
		}
		return err
	}))
	return o
}

func (b *readModelBundle) dedupRows(t *testing.T, projection string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM keiro_projection_dedup WHERE projection_name = $1`, projection).Scan(&n))
	return n
}

var fastWait = events.PositionWait{Timeout: 50 * time.Millisecond, Poll: 5 * time.Millisecond}

// TestReadModelInProjectionSchema: keiro "places a read-model table in a configured schema,
// separate from keiro metadata".
func TestReadModelInProjectionSchema(t *testing.T) {
	b := setupReadModel(t, false)
	appSchema := b.db.Schema + "_app_reads"
	t.Cleanup(func() { _, _ = b.db.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+appSchema+` CASCADE`) })
	placed := events.ReadModel{Name: "placed-counter-read-model", Schema: appSchema, Table: "placed_counter",
		Subscription: "placed-counter-sub", Version: 1, ShapeHash: "placed-counter-v1"}
	require.Equal(t, `"`+appSchema+`"."placed_counter"`, placed.QualifiedTable())
	require.NoError(t, events.EnsureProjectionSchema(b.ctx, b.db.Pool, appSchema))
	require.NoError(t, events.EnsureProjectionSchema(b.ctx, b.db.Pool, appSchema), "idempotent")
	_, err := b.db.Pool.Exec(b.ctx, fmt.Sprintf(createCounterReadModel, placed.QualifiedTable()))
	require.NoError(t, err)
	_, err = b.rms.Register(b.ctx, placed)
	require.NoError(t, err)

	res, err := b.runner.Run(b.ctx, b.db.Pool, "counter-placed", counterCmd{N: 7}, events.RunOptions{
		Hook: func(ctx context.Context, tx pgx.Tx, res events.Result) error {
			return upsertCounter(ctx, tx, placed.QualifiedTable(), "placed", 7, res.Events[0], nil)
		}})
	require.NoError(t, err)
	require.NotZero(t, res.GlobalPosition)
	n, err := b.amountOf(placed, "placed", events.Eventual{})
	require.NoError(t, err)
	require.Equal(t, int64(7), n)

	count := func(schema, table string) int {
		var c int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*)::int FROM pg_tables WHERE schemaname = $1 AND tablename = $2`, schema, table).Scan(&c))
		return c
	}
	require.Equal(t, 1, count(appSchema, "placed_counter"), "the data table is in the application's schema")
	require.Equal(t, 0, count(b.db.Schema, "placed_counter"), "not in the store's schema")
	require.Equal(t, 1, count(b.db.Schema, "keiro_read_models"), "the registry is in the store's schema")
}

// TestReadModelInlineEventual: keiro "queries inline projection with Eventual consistency".
func TestReadModelInlineEventual(t *testing.T) {
	b := setupReadModel(t, true)
	res := b.run(t, "counter-inline", 5)
	require.NotZero(t, res.GlobalPosition)
	n, err := b.amount("inline", events.Eventual{})
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	n, err = b.amount("inline", nil)
	require.NoError(t, err, "nil is the model's default consistency, Eventual when unset")
	require.Equal(t, int64(5), n)
}

// TestReadModelProgressIsMinimumOverBuckets: keiro "reads the minimum checkpoint across
// consumer-group subscription members" — a sharded subscription's progress is the minimum of
// its buckets' checkpoints, and a running sharded subscription satisfies Strong even when a
// bucket has seen no event.
func TestReadModelProgressIsMinimumOverBuckets(t *testing.T) {
	b := setupReadModel(t, true)
	_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO keiro_subscription_shards (subscription_name, bucket, shard_count, checkpoint)
        VALUES ('counter-read-model-sub', 0, 2, 7), ('counter-read-model-sub', 1, 2, 3)`)
	require.NoError(t, err)
	p, err := b.rms.Progress(b.ctx, "counter-read-model-sub")
	require.NoError(t, err)
	require.Equal(t, int64(3), p)
	p, err = b.rms.Progress(b.ctx, "never-ran")
	require.NoError(t, err)
	require.Zero(t, p)

	// A real sharded subscription of 8 buckets over one stream: 7 buckets never see an event.
	sharded := b.model
	sharded.Subscription = "counter-sharded"
	prog := new(testenv.Progress)
	sub, err := events.NewShardedSubscription(b.store, b.db.Pool, events.ShardedSubscriptionConfig{Name: "counter-sharded", Buckets: 8,
		AfterCommit: func(_ int, cp int64) { prog.Set(cp) }}, b.rms.Handler(b.async))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done, ended := make(chan error, 1), make(chan struct{})
	go func() { done <- sub.Run(ctx); close(ended) }()
	t.Cleanup(func() { cancel(); <-ended })
	res := b.run(t, "counter-sharded-1", 4)
	prog.Wait(t, res.GlobalPosition, time.Minute, done)
	n, err := b.amountOf(sharded, "async-idempotent", events.Strong{Timeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(4), n)

	// StartRebuild rewinds every bucket.
	_, err = b.rms.StartRebuild(b.ctx, sharded, []string{b.async.Name}, 0)
	require.NoError(t, err)
	var moved int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM keiro_subscription_shards
        WHERE subscription_name = 'counter-sharded' AND checkpoint <> 0`).Scan(&moved))
	require.Zero(t, moved)
}

// TestReadModelStrongEmptyLog: keiro "Strong returns immediately on an empty log".
func TestReadModelStrongEmptyLog(t *testing.T) {
	b := setupReadModel(t, true)
	n, err := b.amount("empty", events.Strong{Timeout: time.Nanosecond})
	require.NoError(t, err, "no wait: a wait would time out at once")
	require.Zero(t, n)
}

// TestReadModelStrongAtHead: keiro "Strong returns immediately when the subscription is
// already at the store head".
func TestReadModelStrongAtHead(t *testing.T) {
	b := setupReadModel(t, true)
	res := b.run(t, "counter-strong-at-head", 5)
	b.setCheckpoint(t, res.GlobalPosition)
	n, err := b.amount("inline", events.Strong{Timeout: time.Nanosecond})
	require.NoError(t, err, "no wait: a wait would time out at once")
	require.Equal(t, int64(5), n)
}

// TestReadModelStrongWaitsForSubscription: keiro "Strong blocks until the subscription reaches
// the store head captured at query start".
func TestReadModelStrongWaitsForSubscription(t *testing.T) {
	b := setupReadModel(t, true)
	res := b.run(t, "counter-strong-blocking", 6)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := b.rms.Handler(b.async)
	sub, err := events.NewSubscription(b.store, b.db.Pool, events.SubscriptionConfig{Name: b.model.Subscription},
		func(ctx context.Context, tx pgx.Tx, e events.RecordedEvent) error {
			once.Do(func() { close(entered) })
			<-release
			return h(ctx, tx, e)
		})
	require.NoError(t, err)
	type result struct {
		n   int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		n, err := b.amount("async-idempotent", events.Strong{Timeout: time.Minute})
		got <- result{n, err}
	}()
	_, errc := runSub(t, sub)
	select {
	case <-entered:
	case err := <-errc:
		t.Fatalf("subscription stopped: %v", err)
	}
	select {
	case r := <-got:
		t.Fatalf("the Strong query returned before the subscription applied position %d: %+v", res.GlobalPosition, r)
	default:
	}
	close(release)
	r := <-got
	require.NoError(t, r.err)
	require.Equal(t, int64(6), r.n)
}

// TestReadModelStrongCategoryScope: keiro "Strong returns when its category is caught up
// despite another active category".
func TestReadModelStrongCategoryScope(t *testing.T) {
	b := setupReadModel(t, true)
	res := b.run(t, "counter-strong-scope", 8)
	b.setCheckpoint(t, res.GlobalPosition)
	b.run(t, "otherload-1", 1) // another category moves the log's head
	scoped := b.model
	scoped.Category = "counter"
	n, err := b.amountOf(scoped, "inline", events.Strong{Timeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(8), n)
	_, err = b.amount("inline", events.CategoryHead{Category: "counter", Timeout: time.Minute})
	require.NoError(t, err)

	// The whole log's head is out of the subscription's reach.
	_, err = b.amount("inline", events.Strong{Timeout: 20 * time.Millisecond, Poll: time.Millisecond})
	var timeout *events.ReadModelWaitTimeoutError
	require.ErrorAs(t, err, &timeout)
	require.Equal(t, res.GlobalPosition, timeout.LastObserved)
}

// TestReadModelInlineActorAndSourceEvent: keiro "inline projection populates actor and
// source_event_id from command metadata".
func TestReadModelInlineActorAndSourceEvent(t *testing.T) {
	b := setupReadModel(t, true)
	res := b.run(t, "counter-inline-metadata", 5, events.RunOptions{Metadata: events.Metadata{Extra: json.RawMessage(`{"actor":"agent-7"}`)}})
	var (
		amount int64
		actor  *string
		source *[16]byte
	)
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT amount, actor, source_event_id FROM counter_read_model WHERE model_id = 'inline'`).
		Scan(&amount, &actor, &source))
	require.Equal(t, int64(5), amount)
	require.NotNil(t, actor)
	require.Equal(t, "agent-7", *actor)
	require.NotNil(t, source)
	require.Equal(t, [16]byte(res.Events[0].ID), *source)
}

// TestReadModelPositionWait: keiro "waits for async projection cursor with PositionWait".
func TestReadModelPositionWait(t *testing.T) {
	b := setupReadModel(t, true)
	res := b.run(t, "counter-position-wait", 3)
	b.setCheckpoint(t, res.GlobalPosition)
	w := fastWait
	w.Target = res.GlobalPosition
	n, err := b.amount("inline", w)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	n, err = b.amount("inline", events.PositionWait{Timeout: time.Nanosecond})
	require.NoError(t, err, "no target: no wait")
	require.Equal(t, int64(3), n)
}

// TestReadModelPositionWaitTimeout: keiro "times out when PositionWait target is not reached"
// and "counts a position-wait timeout in the timeout counter".
func TestReadModelPositionWaitTimeout(t *testing.T) {
	b := setupReadModel(t, true)
	b.setCheckpoint(t, 1)
	w := fastWait
	w.Target = 5
	_, err := b.amount("timeout", w)
	require.ErrorIs(t, err, events.ErrReadModelWaitTimeout)
	var timeout *events.ReadModelWaitTimeoutError
	require.ErrorAs(t, err, &timeout)
	require.Equal(t, events.ReadModelWaitTimeoutError{Name: "counter-read-model", Target: 5, LastObserved: 1}, *timeout)
	require.Equal(t, int64(1), b.tm.counter(t, "keiro.projection.wait.timeouts"))

	// A cancelled context ends the wait without counting a timeout.
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	err = b.rms.Wait(ctx, b.model, events.PositionWait{Target: 5, Timeout: time.Minute})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int64(1), b.tm.counter(t, "keiro.projection.wait.timeouts"))
}

// TestReadModelQueryDoesNotWriteRegistry: keiro "does not write the registry row on repeated
// read-model queries".
func TestReadModelQueryDoesNotWriteRegistry(t *testing.T) {
	b := setupReadModel(t, true)
	xmin := func() string {
		var x string
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT xmin::text FROM keiro_read_models WHERE name = $1`, b.model.Name).Scan(&x))
		return x
	}
	_, err := b.amount("no-churn", nil)
	require.NoError(t, err)
	before := xmin()
	_, err = b.amount("no-churn", nil)
	require.NoError(t, err)
	_, err = b.rms.Register(b.ctx, b.model)
	require.NoError(t, err)
	require.Equal(t, before, xmin(), "neither a query nor a repeated registration writes the row")
}

// TestReadModelUnregistered: keiro "rejects an unregistered model without creating a registry
// row".
func TestReadModelUnregistered(t *testing.T) {
	b := setupReadModel(t, false)
	m := b.model
	m.Name = "never-registered"
	_, err := b.amountOf(m, "missing", events.Strong{})
	require.ErrorIs(t, err, events.ErrReadModelUnregistered)
	var unreg *events.ReadModelUnregisteredError
	require.ErrorAs(t, err, &unreg)
	require.Equal(t, "never-registered", unreg.Name)
	_, ok, err := b.rms.Lookup(b.ctx, "never-registered")
	require.NoError(t, err)
	require.False(t, ok)
}

// TestReadModelConcurrentRegistration: keiro "handles concurrent explicit read-model
// registration".
func TestReadModelConcurrentRegistration(t *testing.T) {
	b := setupReadModel(t, false)
	const n = 8
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			info, err := b.rms.Register(b.ctx, b.model)
			if err == nil && (info.Status != events.StatusLive || info.Version != 1) {
				err = errors.New("unexpected registry row")
			}
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	n0, err := b.amount("concurrent", nil)
	require.NoError(t, err)
	require.Zero(t, n0)
}

// TestReadModelStaleSchema: keiro "rejects stale read-model schema".
func TestReadModelStaleSchema(t *testing.T) {
	b := setupReadModel(t, true)
	_, err := b.amount("stale", nil)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE keiro_read_models SET version = 99 WHERE name = $1`, b.model.Name)
	require.NoError(t, err)
	_, err = b.amount("stale", nil)
	require.ErrorIs(t, err, events.ErrReadModelStaleSchema)
	var stale *events.ReadModelStaleSchemaError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, events.ReadModelStaleSchemaError{Name: "counter-read-model", ExpectedVersion: 1, FoundVersion: 99,
		ExpectedShapeHash: "counter-read-model-v1", FoundShapeHash: "counter-read-model-v1"}, *stale)

	// Registration does not overwrite the drift; a stale model that is also rebuilding reports
	// the stale schema first (keiro's order).
	info, err := b.rms.Register(b.ctx, b.model)
	require.NoError(t, err)
	require.Equal(t, int64(99), info.Version)
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE keiro_read_models SET status = 'rebuilding' WHERE name = $1`, b.model.Name)
	require.NoError(t, err)
	_, err = b.amount("stale", nil)
	require.ErrorIs(t, err, events.ErrReadModelStaleSchema)
}

// TestReadModelUnknownStatus: keiro "surfaces unknown read-model statuses with the raw status
// text".
func TestReadModelUnknownStatus(t *testing.T) {
	b := setupReadModel(t, true)
	_, err := b.amount("unknown-status", nil)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE keiro_read_models SET status = 'wedged' WHERE name = $1`, b.model.Name)
	require.NoError(t, err)
	_, err = b.amount("unknown-status", nil)
	require.ErrorIs(t, err, events.ErrReadModelNotLive)
	var notLive *events.ReadModelNotLiveError
	require.ErrorAs(t, err, &notLive)
	require.Equal(t, events.ReadModelStatus("wedged"), notLive.Status)
	require.False(t, notLive.Status.Known())
	require.Contains(t, err.Error(), `"wedged"`)
}

// TestAsyncProjectionDuplicate: keiro "ignores duplicate async event by source_event_id".
func TestAsyncProjectionDuplicate(t *testing.T) {
	b := setupReadModel(t, true)
	b.run(t, "counter-async-idempotent", 7)
	e := b.only(t, "counter-async-idempotent")
	var first, second events.AsyncOutcome
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		if first, err = b.rms.ApplyTx(b.ctx, tx, b.async, e); err != nil {
			return err
		}
		second, err = b.rms.ApplyTx(b.ctx, tx, b.async, e)
		return err
	}))
	require.Equal(t, events.AsyncApplied, first)
	require.Equal(t, events.AsyncDuplicate, second)
	n, err := b.amount("async-idempotent", nil)
	require.NoError(t, err)
	require.Equal(t, int64(7), n)
}

// TestAsyncProjectionDedupAndPrune: keiro "deduplicates async projection application across
// transactions and reopens after pruning".
func TestAsyncProjectionDedupAndPrune(t *testing.T) {
	b := setupReadModel(t, true)
	_, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE projection_dedup_counter (id boolean PRIMARY KEY DEFAULT true, amount bigint NOT NULL);
        INSERT INTO projection_dedup_counter VALUES (true, 0)`)
	require.NoError(t, err)
	_, err = b.rms.Register(b.ctx, events.ReadModel{Name: "projection-dedup-counter-model", Version: 1, ShapeHash: "projection-dedup-counter-v1"})
	require.NoError(t, err)
	b.run(t, "counter-async-dedup-window", 7)
	e := b.only(t, "counter-async-dedup-window")
	inc := events.AsyncProjection{Name: "incrementing-async-projection", ReadModel: "projection-dedup-counter-model",
		Apply: func(ctx context.Context, tx pgx.Tx, _ events.RecordedEvent) error {
			_, err := tx.Exec(ctx, `UPDATE projection_dedup_counter SET amount = amount + 1`)
			return err
		}}
	count := func() int64 {
		var n int64
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT amount FROM projection_dedup_counter`).Scan(&n))
		return n
	}
	require.Equal(t, events.AsyncApplied, b.apply(t, inc, e, false))
	require.Equal(t, events.AsyncDuplicate, b.apply(t, inc, e, false))
	require.Equal(t, int64(1), count())
	pruned, err := b.rms.PruneDedup(b.ctx, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(1), pruned)
	require.Equal(t, events.AsyncApplied, b.apply(t, inc, e, false))
	require.Equal(t, int64(2), count())
}

// TestReadModelRebuild: keiro "rebuild repopulates the projection table through the supported
// workflow".
func TestReadModelRebuild(t *testing.T) {
	b := setupReadModel(t, true)
	b.run(t, "counter-rebuild-runbook", 7)
	e := b.only(t, "counter-rebuild-runbook")
	require.Equal(t, events.AsyncApplied, b.apply(t, b.async, e, false))
	b.setCheckpoint(t, e.GlobalPosition)
	n, err := b.amount("async-idempotent", nil)
	require.NoError(t, err)
	require.Equal(t, int64(7), n)

	info, err := b.rms.StartRebuild(b.ctx, b.model, []string{b.async.Name}, 0)
	require.NoError(t, err)
	require.Equal(t, events.StatusRebuilding, info.Status)
	p, err := b.rms.Progress(b.ctx, b.model.Subscription)
	require.NoError(t, err)
	require.Zero(t, p, "the checkpoint was rewound")
	require.Zero(t, b.dedupRows(t, b.async.Name), "the projection's keys were deleted")
	_, err = b.amount("async-idempotent", nil)
	var notLive *events.ReadModelNotLiveError
	require.ErrorAs(t, err, &notLive)
	require.Equal(t, events.StatusRebuilding, notLive.Status)

	require.Equal(t, events.AsyncApplied, b.apply(t, b.async, e, true))
	info, err = b.rms.FinishRebuild(b.ctx, b.model, []string{b.async.Name}, 0)
	require.NoError(t, err)
	require.Equal(t, events.StatusLive, info.Status)
	n, err = b.amount("async-idempotent", nil)
	require.NoError(t, err)
	require.Equal(t, int64(7), n, "the table was emptied and replayed once")
}

// TestReadModelRebuildAppliedNothingStaysOffline: keiro "keeps a non-empty-log rebuild offline
// when replay applies nothing".
func TestReadModelRebuildAppliedNothingStaysOffline(t *testing.T) {
	b := setupReadModel(t, true)
	b.run(t, "counter-rebuild-empty-replay", 7)
	_, err := b.rms.StartRebuild(b.ctx, b.model, []string{b.async.Name}, 0)
	require.NoError(t, err)
	_, err = b.rms.FinishRebuild(b.ctx, b.model, []string{b.async.Name}, 0)
	require.ErrorIs(t, err, events.ErrRebuildProducedNoApplies)
	var guard *events.RebuildProducedNoAppliesError
	require.ErrorAs(t, err, &guard)
	require.Equal(t, "counter-read-model", guard.Name)
	require.Positive(t, guard.Head)
	_, err = b.amount("async-idempotent", nil)
	var notLive *events.ReadModelNotLiveError
	require.ErrorAs(t, err, &notLive)
	require.Equal(t, events.StatusRebuilding, notLive.Status)

	// An empty log, or an inline-only model (no projections named), may go live empty.
	_, err = b.rms.FinishRebuild(b.ctx, b.model, nil, 0)
	require.NoError(t, err)
}

// TestReadModelRebuildFencesLiveApplier: keiro "fences live async application while a model is
// rebuilding".
func TestReadModelRebuildFencesLiveApplier(t *testing.T) {
	b := setupReadModel(t, true)
	b.run(t, "counter-fenced-apply", 7)
	e := b.only(t, "counter-fenced-apply")
	_, err := b.rms.StartRebuild(b.ctx, b.model, []string{b.async.Name}, 0)
	require.NoError(t, err)
	require.Equal(t, events.AsyncFenced, b.apply(t, b.async, e, false))
	require.Zero(t, b.dedupRows(t, b.async.Name))
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM counter_read_model`).Scan(&n))
	require.Zero(t, n)

	// An unregistered model fences too.
	other := b.async
	other.ReadModel = "never-registered"
	require.Equal(t, events.AsyncFenced, b.apply(t, other, e, false))
}

// TestReadModelRebuildRaceAndReopen: keiro "keeps a live applier out of the rebuild window and
// reopens it after promotion". The rebuild is held inside its transaction (its TRUNCATE waits
// for a reader of the table) after it took the registry row; a live applier that starts then
// waits for the rebuild's commit and is fenced.
func TestReadModelRebuildRaceAndReopen(t *testing.T) {
	b := setupReadModel(t, true)
	b.run(t, "counter-fence-race", 7)
	e := b.only(t, "counter-fence-race")

	reader, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = reader.Rollback(b.ctx) }()
	_, err = reader.Exec(b.ctx, `SELECT count(*) FROM counter_read_model`)
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() {
		_, err := b.rms.StartRebuild(b.ctx, b.model, []string{b.async.Name}, 0)
		started <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
            WHERE relation = 'counter_read_model'::regclass AND mode = 'AccessExclusiveLock' AND NOT granted)`).Scan(&waiting))
		return waiting
	}, time.Minute, time.Millisecond, "the rebuild reached its TRUNCATE")
	applied := make(chan events.AsyncOutcome, 1)
	go func() {
		var o events.AsyncOutcome
		err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			o, err = b.rms.ApplyTx(b.ctx, tx, b.async, e)
			return err
		})
		if err != nil {
			o = 0
		}
		applied <- o
	}()
	require.NoError(t, reader.Rollback(b.ctx))
	require.NoError(t, <-started)
	require.Equal(t, events.AsyncFenced, <-applied, "the live applier is kept out of the rebuild window")
	require.Zero(t, b.dedupRows(t, b.async.Name))

	require.Equal(t, events.AsyncApplied, b.apply(t, b.async, e, true))
	_, err = b.rms.FinishRebuild(b.ctx, b.model, []string{b.async.Name}, 0)
	require.NoError(t, err)
	pruned, err := b.rms.PruneDedup(b.ctx, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(1), pruned)
	require.Equal(t, events.AsyncApplied, b.apply(t, b.async, e, false), "reopened after promotion")
	n, err := b.amount("async-idempotent", nil)
	require.NoError(t, err)
	require.Equal(t, int64(14), n, "the replayed and the reapplied event (pruning reopened it)")
}

// TestReadModelStatusTransitions: keiro "tracks rebuild state transitions"; last_built_at is
// stamped only by a transition to live.
func TestReadModelStatusTransitions(t *testing.T) {
	b := setupReadModel(t, true)
	registered, _, err := b.rms.Lookup(b.ctx, b.model.Name)
	require.NoError(t, err)
	require.NotNil(t, registered.LastBuiltAt)
	rebuilding, err := b.rms.SetStatus(b.ctx, b.model, events.StatusRebuilding)
	require.NoError(t, err)
	require.Equal(t, events.StatusRebuilding, rebuilding.Status)
	require.Equal(t, *registered.LastBuiltAt, *rebuilding.LastBuiltAt, "not stamped by rebuilding")
	live, err := b.rms.SetStatus(b.ctx, b.model, events.StatusLive)
	require.NoError(t, err)
	require.Equal(t, events.StatusLive, live.Status)
	require.True(t, live.LastBuiltAt.After(*registered.LastBuiltAt), "stamped by live")
	abandoned, err := b.rms.AbandonRebuild(b.ctx, b.model)
	require.NoError(t, err)
	require.Equal(t, events.StatusAbandoned, abandoned.Status)
	require.Equal(t, *live.LastBuiltAt, *abandoned.LastBuiltAt)
	_, err = b.amount("x", nil)
	require.ErrorIs(t, err, events.ErrReadModelNotLive)
}

// TestReadModelSubscriptionHoldsWhileRebuilding: a subscription applying a projection with
// ReadModels.Handler holds its events while the model rebuilds (no dead letter, no checkpoint
// past them) and goes on after the promotion; the events the rebuild replayed are duplicates.
func TestReadModelSubscriptionHoldsWhileRebuilding(t *testing.T) {
	b := setupReadModel(t, true)
	b.run(t, "counter-hold", 2)
	b.run(t, "counter-hold", 3)
	prog := new(testenv.Progress)
	sub, err := events.NewSubscription(b.store, b.db.Pool, events.SubscriptionConfig{Name: b.model.Subscription,
		PollInterval: 5 * time.Millisecond, AfterCommit: prog.Set,
		Retry: events.RetryPolicy{MaxDeliveries: 1}}, b.rms.Handler(b.async))
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	h := head(t, b.store, b.db)
	prog.Wait(t, h, time.Minute, errc)
	n, err := b.amount("async-idempotent", events.Strong{Timeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(5), n)

	_, err = b.rms.StartRebuild(b.ctx, b.model, []string{b.async.Name}, 0)
	require.NoError(t, err)
	// The rebuilder replays the log with ApplyUnfencedTx while the subscription is held.
	for _, e := range collect(t, b.store.ReadAll(b.ctx, b.db.Pool, 0)) {
		require.Equal(t, events.AsyncApplied, b.apply(t, b.async, e, true))
	}
	p, err := b.rms.Progress(b.ctx, b.model.Subscription)
	require.NoError(t, err)
	require.Zero(t, p, "the held subscription did not move its checkpoint")
	_, err = b.rms.FinishRebuild(b.ctx, b.model, []string{b.async.Name}, 0)
	require.NoError(t, err)
	n, err = b.amount("async-idempotent", events.Strong{Timeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(5), n, "the subscription's redeliveries were duplicates")
	dead, err := b.store.ListDeadLetters(b.ctx, b.db.Pool, events.DeadLetterFilter{Subscription: b.model.Subscription})
	require.NoError(t, err)
	require.Empty(t, dead, "a fenced delivery is never dead-lettered")
}

// TestReadModelQueryNoticesRegistryChange: a query whose registry row changes while its
// function runs does not return that run's result: a model no longer live is refused, and a
// model live again (a whole rebuild in between) runs the function again.
func TestReadModelQueryNoticesRegistryChange(t *testing.T) {
	b := setupReadModel(t, true)
	calls := 0
	err := b.rms.Query(b.ctx, b.model, nil, func(ctx context.Context, tx pgx.Tx) error {
		calls++
		_, err := b.rms.SetStatus(ctx, b.model, events.StatusRebuilding)
		return err
	})
	require.ErrorIs(t, err, events.ErrReadModelNotLive)
	require.Equal(t, 1, calls)

	_, err = b.rms.SetStatus(b.ctx, b.model, events.StatusLive)
	require.NoError(t, err)
	calls = 0
	err = b.rms.Query(b.ctx, b.model, nil, func(ctx context.Context, tx pgx.Tx) error {
		calls++
		if calls == 1 {
			if _, err := b.rms.StartRebuild(ctx, b.model, nil, 0); err != nil {
				return err
			}
			_, err := b.rms.FinishRebuild(ctx, b.model, nil, 0)
			return err
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, calls, "the first run's result was read across a rebuild")
}

// TestReadModelRebuildInOneCall: ReadModels.Rebuild replays the log into an emptied model
// while a live subscription holds, promotes it, and the subscription then finds the replayed
// events applied; a replay that fails leaves the model rebuilding.
func TestReadModelRebuildInOneCall(t *testing.T) {
	b := setupReadModel(t, true)
	for _, n := range []int{1, 2, 3} {
		b.run(t, "counter-one-call", n)
	}
	b.run(t, "other-1", 50) // another category: the model follows "counter" only
	b.model.Category = "counter"
	prog := new(testenv.Progress)
	sub, err := events.NewSubscription(b.store, b.db.Pool, events.SubscriptionConfig{Name: b.model.Subscription,
		Category: "counter", PollInterval: 5 * time.Millisecond, AfterCommit: prog.Set,
		Retry: events.RetryPolicy{MaxDeliveries: 1}}, b.rms.Handler(b.async))
	require.NoError(t, err)
	_, errc := runSub(t, sub)
	prog.Wait(t, head(t, b.store, b.db), time.Minute, errc)
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE counter_read_model SET amount = 1000`) // damage it
	require.NoError(t, err)

	info, err := b.rms.Rebuild(b.ctx, b.model, []events.AsyncProjection{b.async}, 0)
	require.NoError(t, err)
	require.Equal(t, events.StatusLive, info.Status)
	require.Equal(t, int64(3), b.dedupRows(t, b.async.Name))
	b.run(t, "counter-one-call", 4)
	n, err := b.amount("async-idempotent", events.Strong{Timeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(10), n, "1+2+3 replayed once, 4 applied live")

	failing := b.async
	failing.Apply = func(context.Context, pgx.Tx, events.RecordedEvent) error { return errors.New("boom") }
	_, err = b.rms.Rebuild(b.ctx, b.model, []events.AsyncProjection{failing}, 0)
	require.ErrorContains(t, err, "boom")
	_, err = b.amount("async-idempotent", nil)
	var notLive *events.ReadModelNotLiveError
	require.ErrorAs(t, err, &notLive)
	require.Equal(t, events.StatusRebuilding, notLive.Status)
}
