package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/pgtext"
	"github.com/keiro-go/keiro/internal/schemaname"
)

// Handler applies one event's effects through tx, the inbox transaction: its writes commit
// together with the dedupe row, or not at all. Returning an error rolls everything back and
// records a failed attempt; wrap it with [Permanent] to poison the message at once. The handler
// must not commit tx (Commit returns [ErrTxOwned]); rolling it back is reported as
// [ErrHandlerRolledBack]. ctx carries the `process <topic>` span.
type Handler func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error

// KafkaRef locates a delivery in Kafka.
type KafkaRef struct {
	// Topic is the topic the record was read from.
	Topic string
	// Partition is the record's partition.
	Partition int32
	// Offset is the record's offset.
	Offset int64
}

// Delivery is one received event and, when it came from Kafka, where it came from.
type Delivery struct {
	// Event is the decoded envelope.
	Event envelope.Event
	// Kafka is the record's position; nil for deliveries from elsewhere.
	Kafka *KafkaRef
}

// Outcome classifies what Process did with a delivery.
type Outcome int

const (
	// Processed: the handler ran and its effects committed with the dedupe row.
	Processed Outcome = iota + 1
	// Duplicate: the message was already processed (or a concurrent process just did it);
	// the handler did not run.
	Duplicate
	// PreviouslyFailed: the message is poisoned (attempt ceiling reached or permanent
	// failure); the handler did not run. The consumer dead-letters it and moves on.
	PreviouslyFailed
	// HandlerFailed: the handler failed, its effects were rolled back, and the failed attempt
	// was recorded; Attempts is below the ceiling, so a retry may succeed.
	HandlerFailed
	// Poisoned: the handler failed and the message reached the attempt ceiling or failed
	// with a [Permanent] error. It will not run again on redelivery.
	Poisoned
	// Deferred: the handler failed because of contention ([IsContention]: a deadlock, a
	// serialization failure, a lock timeout) or an [Outage] of one of its dependencies, not
	// because of the message. Its effects were rolled back and no attempt was recorded
	// (Attempts is the row's unchanged count); retry later. The consumer runner retries with
	// backoff, and counts contention as an ordinary failure once its own bound is spent.
	Deferred
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case PreviouslyFailed:
		return "previously_failed"
	case HandlerFailed:
		return "handler_failed"
	case Poisoned:
		return "poisoned"
	case Deferred:
		return "deferred"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is what Process did with one delivery.
type Result struct {
	// Outcome classifies the result.
	Outcome Outcome
	// Attempts is the row's failed-attempt count after this call (kept when a retry
	// succeeds; 0 for a first-time success).
	Attempts int
	// Err is the handler's error for HandlerFailed, Poisoned and Deferred, the stored last
	// error for PreviouslyFailed, and nil otherwise.
	Err error
	// DedupeKey is the key the delivery was deduplicated under.
	DedupeKey string
	// DeadLettered reports, for PreviouslyFailed, that the consumer runner already produced the
	// message to the dead-letter topic: this delivery is a redelivery of a dead letter.
	DeadLettered bool
}

// Persistence chooses which envelope columns a successfully processed row keeps.
type Persistence int

const (
	// FullEnvelope stores every envelope column on success. The default.
	FullEnvelope Persistence = iota
	// DedupeOnly stores no payload, attributes, trace context, schema version or schema
	// reference on the success path (identity, type, causation/correlation, occurred_at and
	// the Kafka coordinates are kept). Failed rows always keep the full envelope.
	DedupeOnly
)

// Defaults of StoreConfig.
const (
	// DefaultMaxAttempts is the failed-attempt ceiling after which a message is poisoned.
	DefaultMaxAttempts = 5
)

// StoreConfig configures a Store.
type StoreConfig struct {
	// Schema is the PostgreSQL schema holding keiro_inbox. Defaults to migrations.DefaultSchema.
	Schema string
	// Consumer names the consuming bounded context (usually the consumer group); it is the
	// first component of the inbox primary key, so two consumers sharing a database never
	// deduplicate each other's messages. Required; no default.
	Consumer string
	// DedupePolicy computes each delivery's dedupe key. Defaults to DedupeMessageID.
	DedupePolicy DedupePolicy
	// Persistence chooses what a successful row stores. Defaults to FullEnvelope.
	Persistence Persistence
	// MaxAttempts is the number of failed attempts after which a message is poisoned.
	// Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// MeterProvider supplies the "keiro" meter. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider supplies the "keiro" tracer. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (c *StoreConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = schemaname.Default
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
}

func (c *StoreConfig) validate() error {
	var errs []error
	if err := schemaname.Validate(c.Schema); err != nil {
		errs = append(errs, fmt.Errorf("Schema: %w", err))
	}
	if c.Consumer == "" {
		errs = append(errs, errors.New("Consumer: required; name the consuming bounded context (for example the consumer group)"))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("MaxAttempts: must be at least 1, got %d", c.MaxAttempts))
	}
	if c.Persistence != FullEnvelope && c.Persistence != DedupeOnly {
		errs = append(errs, fmt.Errorf("Persistence: unknown mode %d", c.Persistence))
	}
	return errors.Join(errs...)
}

// Store is the inbox of one consumer: it runs handlers at most once per (source, dedupe key)
// while the completed row is retained. It is safe for concurrent use.
type Store struct {
	cfg   StoreConfig
	sql   statements
	in    *instruments
	group string // consumer group, for the span attribute; set by the runner
}

// NewStore validates cfg and returns a Store.
func NewStore(cfg StoreConfig) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("inbox store config: %w", err)
	}
	in, err := newInstruments(cfg.MeterProvider, cfg.TracerProvider)
	if err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, sql: newStatements(cfg.Schema), in: in}, nil
}

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() StoreConfig { return s.cfg }

// DedupeKey computes d's dedupe key under the configured policy, or returns a
// *[DedupePolicyError].
func (s *Store) DedupeKey(d Delivery) (string, error) { return s.cfg.DedupePolicy.Key(d) }

// Process runs h for d at most once (per consumer, d.Event.Source and dedupe key), in one
// transaction with the dedupe row:
//
//   - insert-first: the completed dedupe row is inserted before h runs, so a concurrent
//     delivery of the same message blocks on the primary key and then classifies Duplicate;
//   - a row already completed → Duplicate; failed below the ceiling → h runs again;
//     poisoned → PreviouslyFailed;
//   - h fails (error, panic, aborted or rolled-back transaction) → rollback, then a separate
//     transaction records the failed attempt with the full envelope → HandlerFailed, or
//     Poisoned at the ceiling or for a [Permanent] error;
//   - h fails with contention ([IsContention]) or an [Outage] → rollback, no attempt is
//     recorded → Deferred (the caller retries later and bounds the retries it allows).
//
// The returned error is for the storage, not the handler: an unsatisfiable dedupe policy
// (*[DedupePolicyError]) or a database failure, after which the outcome is unknown and the
// delivery should be retried (a committed one then classifies Duplicate).
func (s *Store) Process(ctx context.Context, db keiro.DB, d Delivery, h Handler) (Result, error) {
	key, err := s.cfg.DedupePolicy.Key(d)
	if err != nil {
		return Result{}, err
	}
	return s.process(ctx, db, d, key, h, false)
}

func (s *Store) topic(d *Delivery) string {
	if d.Kafka != nil {
		return d.Kafka.Topic
	}
	return d.Event.Destination
}

// process is Process with the key computed. force runs a poisoned failed row again (Reprocess).
func (s *Store) process(ctx context.Context, db keiro.DB, d Delivery, key string, h Handler, force bool) (res Result, err error) {
	ctx, span := s.in.startProcessSpan(ctx, s.group, &d)
	defer func() {
		endProcessSpan(span, res, err)
		if err == nil {
			s.in.count(ctx, s.cfg.Consumer, s.topic(&d), res, 1)
		}
	}()
	for range 3 {
		res, retry, err := s.attempt(ctx, db, d, key, h, force)
		if !retry {
			return res, err
		}
	}
	return Result{DedupeKey: key}, fmt.Errorf("process inbox delivery %s: the row kept disappearing under concurrent retention", key)
}

// attempt runs one insert-first transaction. retry is true when the conflicting row vanished
// between the insert and the read (concurrent retention) and the insert should be tried again.
func (s *Store) attempt(ctx context.Context, db keiro.DB, d Delivery, key string, h Handler, force bool) (res Result, retry bool, err error) {
	res.DedupeKey = key
	source := d.Event.Source
	tx, err := db.Begin(ctx)
	if err != nil {
		return res, false, fmt.Errorf("begin inbox transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	cols := newRowColumns(1)
	cols.add(source, key, &d, s.cfg.Persistence == FullEnvelope)
	inserted, err := s.insertCompleted(ctx, tx, cols)
	if err != nil {
		return res, false, err
	}
	rerun := false
	if len(inserted) == 0 {
		found, err := s.readExisting(ctx, tx, []rowKey{{source, key}})
		if err != nil {
			return res, false, err
		}
		e, ok := found[rowKey{source, key}]
		if !ok {
			return res, true, nil // vanished under retention: insert again
		}
		if rerun = s.settleExisting(e, force, &res); !rerun {
			return res, false, nil
		}
	}

	row := &handledRow{s: s, source: source, key: key}
	herr := s.runHandler(ctx, tx, d.Event, h, row)
	if herr == nil && rerun && !row.failed {
		q := s.sql.markCompleted
		if s.cfg.Persistence == DedupeOnly {
			q = s.sql.markCompletedDO
		}
		if _, err := tx.Exec(ctx, q, s.cfg.Consumer, source, key); err != nil {
			if !isTxAborted(err) {
				return res, false, fmt.Errorf("mark inbox row %s/%s completed: %w", source, key, err)
			}
			herr = ErrTxAborted
		}
	}
	if herr == nil {
		err := tx.Commit(ctx)
		switch {
		case err == nil:
			res.Outcome = Processed
			return res, false, nil
		case errors.Is(err, pgx.ErrTxCommitRollback):
			herr = ErrTxAborted
		default:
			return res, false, fmt.Errorf("commit inbox transaction %s/%s: %w", source, key, err)
		}
	}
	if tx.Conn().IsClosed() {
		// The handler failed because the database went away: an outage, not an attempt.
		return res, false, fmt.Errorf("inbox transaction %s/%s lost its connection: %w", source, key, herr)
	}
	_ = tx.Rollback(ctx)
	if kind, _ := deferral(herr); kind != deferNone {
		// Contention or an outage of a dependency says nothing about the message: no attempt.
		res.Outcome, res.Err = Deferred, herr
		return res, false, nil
	}
	res, err = s.recordFailure(ctx, db, &d, key, herr)
	return res, false, err
}

func (s *Store) insertCompleted(ctx context.Context, tx pgx.Tx, cols *rowColumns) (map[[2]string]bool, error) {
	rows, err := tx.Query(ctx, s.sql.insertCompleted, append([]any{s.cfg.Consumer}, cols.args()...)...)
	if err != nil {
		return nil, fmt.Errorf("insert inbox rows: %w", err)
	}
	inserted := make(map[[2]string]bool, len(cols.source))
	var src, key string
	_, err = pgx.ForEachRow(rows, []any{&src, &key}, func() error {
		inserted[[2]string{src, key}] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("insert inbox rows: %w", err)
	}
	return inserted, nil
}

// maxErrorLen bounds last_error.
const maxErrorLen = 8 << 10

// unstorable reports an error of the inbox's own statements that the delivery's content
// causes: PostgreSQL refuses its bytes (class 22: invalid UTF-8 or NUL in a text header, \u0000
// in the attributes' JSON) or its size (54000: a dedupe key too long for the index). Retrying
// cannot help; the consumer dead-letters the record (ReasonUnstorable).
func unstorable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || pe.Code == "54000")
}

// recordFailure records a failed attempt in its own transaction.
func (s *Store) recordFailure(ctx context.Context, db keiro.DB, d *Delivery, key string, herr error) (Result, error) {
	res := Result{DedupeKey: key, Err: herr}
	msg := pgtext.Storable(herr.Error(), maxErrorLen)
	cols := newRowColumns(1)
	cols.add(d.Event.Source, key, d, true)
	args := append([]any{s.cfg.Consumer}, cols.args()...)
	args = append(args, msg, IsPermanent(herr), s.cfg.MaxAttempts)
	var (
		attempts int32
		poisoned bool
	)
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, s.sql.recordFailure, args...).Scan(&attempts, &poisoned)
	})
	if unstorable(err) {
		// The failed row keeps the full envelope, the completed row may not (DedupeOnly): a
		// header PostgreSQL refuses must not turn a transient failure of a message that could
		// complete into a dead letter. Store it with the offending characters replaced.
		cols.makeStorable()
		args = append([]any{s.cfg.Consumer}, cols.args()...)
		args = append(args, msg, IsPermanent(herr), s.cfg.MaxAttempts)
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, s.sql.recordFailure, args...).Scan(&attempts, &poisoned)
		})
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Another process completed the message meanwhile; its effects committed once.
		res.Outcome = Duplicate
		return res, nil
	case err != nil:
		return res, fmt.Errorf("record failed inbox attempt %s/%s (handler error: %v): %w", d.Event.Source, key, herr, err)
	}
	res.Attempts = int(attempts)
	res.Outcome = HandlerFailed
	if poisoned {
		res.Outcome = Poisoned
	}
	return res, nil
}

// markDeadLettered records that the dead-letter produce of the poisoned row (source, key) was
// acknowledged, so that later deliveries classify as duplicates instead of dead letters.
func (s *Store) markDeadLettered(ctx context.Context, db keiro.DB, source, key string) error {
	if _, err := db.Exec(ctx, s.sql.markDeadLettered, s.cfg.Consumer, source, key); err != nil {
		return fmt.Errorf("mark inbox row %s/%s dead-lettered: %w", source, key, err)
	}
	return nil
}

// handlerTx is the transaction given to a handler: Commit is refused, Rollback is noted. row
// is the inbox row of the handler's message (nil for a BatchHandler, which handles several).
type handlerTx struct {
	pgx.Tx
	rolledBack bool
	row        *handledRow
}

// handledRow is the inbox row of the message a handler runs for, and whether the handler marked
// it failed (MarkFailedTx): the inbox then leaves the mark in place of completing the row.
type handledRow struct {
	s           *Store
	source, key string
	failed      bool
}

func (t *handlerTx) Commit(context.Context) error { return ErrTxOwned }

func (t *handlerTx) Rollback(ctx context.Context) error {
	t.rolledBack = true
	return t.Tx.Rollback(ctx)
}

func (s *Store) runHandler(ctx context.Context, tx pgx.Tx, ev envelope.Event, h Handler, row *handledRow) (err error) {
	htx := &handlerTx{Tx: tx, row: row}
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
		s.in.handlerDuration.Record(ctx, time.Since(start).Seconds())
		if err == nil && htx.rolledBack {
			err = ErrHandlerRolledBack
		}
	}()
	return h(ctx, htx, ev)
}

func (s *Store) runBatchHandler(ctx context.Context, tx pgx.Tx, evs []envelope.Event, bh BatchHandler) (err error) {
	htx := &handlerTx{Tx: tx}
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
		s.in.handlerDuration.Record(ctx, time.Since(start).Seconds())
		if err == nil && htx.rolledBack {
			err = ErrHandlerRolledBack
		}
	}()
	return bh(ctx, htx, evs)
}

func isTxAborted(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "25P02" || errors.Is(err, pgx.ErrTxClosed)
}
