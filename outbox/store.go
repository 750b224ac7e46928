package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/schemaname"
	"github.com/keiro-go/keiro/outbox/internal/logmsg"
	"github.com/keiro-go/keiro/outbox/internal/metrics"
	"github.com/keiro-go/keiro/outbox/internal/sqlq"
	"github.com/keiro-go/keiro/tracing"
)

// DefaultSchema is the PostgreSQL schema the package-level helpers use.
const DefaultSchema = schemaname.Default

// ErrIdentityConflict reports an enqueue whose (source, message id) is already in the outbox
// with different content. The retained row is never overwritten; the caller should roll the
// transaction back. The error names the message id and the differing field classes, never
// their values. Test for it with errors.Is; the concrete type is *IdentityConflictError.
var ErrIdentityConflict = errors.New("outbox: message id already enqueued with different content")

// ErrOutboxIDTaken reports an EnqueueWithIDsTx whose outbox id is already the id of a row with
// another (source, message id): the producer's identity inputs collide with an earlier row's,
// typically because the message id prefix changed. The transaction is aborted.
var ErrOutboxIDTaken = errors.New("outbox id already used by another message")

// IdentityConflictError is the error EnqueueTx returns for an identity conflict.
type IdentityConflictError struct {
	// Source and MessageID identify the message.
	Source, MessageID string
	// Fields lists the differing field classes (keiro's ConflictField names: routing, schema,
	// payload, occurred_at, causal, trace, attributes, provenance).
	Fields []string
}

// Error implements error.
func (e *IdentityConflictError) Error() string {
	return fmt.Sprintf("outbox: message %q of source %q already enqueued with different %s",
		e.MessageID, e.Source, strings.Join(e.Fields, ", "))
}

// Is reports whether target is ErrIdentityConflict.
func (e *IdentityConflictError) Is(target error) bool { return target == ErrIdentityConflict }

// EnqueueOutcome says what EnqueueTx did with one event.
type EnqueueOutcome int

const (
	// Inserted means a new row was written.
	Inserted EnqueueOutcome = iota + 1
	// Duplicate means a row with the same (source, message id) and identical content was
	// already there; nothing was written.
	Duplicate
	// Conflict means a row with the same (source, message id) but different content was
	// already there; nothing was written and EnqueueTx returned an error.
	Conflict
)

// String returns "inserted", "duplicate" or "conflict".
func (o EnqueueOutcome) String() string {
	switch o {
	case Inserted:
		return "inserted"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	}
	return fmt.Sprintf("EnqueueOutcome(%d)", int(o))
}

// EnqueueResult reports the fate of one enqueued event, in the order the events were given.
type EnqueueResult struct {
	// OutboxID is the row's id: the new row's for Inserted, the retained row's otherwise.
	OutboxID envelope.UUID
	// MessageID is the event's message id.
	MessageID string
	// Outcome says whether the row was inserted, a duplicate or a conflict.
	Outcome EnqueueOutcome
}

// StoreOptions tunes a Store.
type StoreOptions struct {
	// DisableNotify stops EnqueueTx from ever sending a NOTIFY in the caller's transaction. By
	// default it sends one only while a relay sleeps (see the package doc): a NOTIFY takes a
	// database-wide lock from the commit until its WAL flush completes, so committing
	// transactions that notified queue up behind each other (halved commit rate at 16
	// producers, BENCHMARKS.md "Enqueue"). Without it, relays that sleep find new rows by
	// polling (RelayConfig.PollInterval), or the producer wakes them after commit with
	// [Store.Notify], outside any transaction. Defaults to false (notify while a relay sleeps).
	DisableNotify bool
	// MeterProvider provides the "keiro" meter for keiro.outbox.enqueued. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Store reads and writes one schema's outbox table. It holds no connection: every method takes
// the transaction or keiro.DB to run on. A Store is safe for concurrent use.
type Store struct {
	schema string
	opts   StoreOptions
	q      *sqlq.Queries
	inst   *metrics.Instruments
	// slotWait, if set (tests), runs each time awaitConsistentSlot finds the slot not yet
	// consistent.
	slotWait func()
	// logEnqueue is whether the last enqueue found the schema in log mode: the next one runs
	// log mode's statement first (Store.insert).
	logEnqueue atomic.Bool
	// prefix is the prefix of EmitTx's logical decoding messages (logmsg.Prefix).
	prefix string
}

// NewStore returns a Store for the outbox in schema, which must be a valid schema name
// (lowercase letters, digits and underscores). At most one StoreOptions may be given.
func NewStore(schema string, opts ...StoreOptions) (*Store, error) {
	if err := schemaname.Validate(schema); err != nil {
		return nil, fmt.Errorf("new outbox store: %w", err)
	}
	if len(opts) > 1 {
		return nil, errors.New("new outbox store: at most one StoreOptions")
	}
	s := &Store{schema: schema, q: sqlq.New(schema), prefix: logmsg.Prefix(schema)}
	if len(opts) == 1 {
		s.opts = opts[0]
	}
	inst, err := metrics.New(s.opts.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("new outbox store: create instruments: %w", err)
	}
	s.inst = inst
	return s, nil
}

// Schema returns the schema the Store addresses.
func (s *Store) Schema() string { return s.schema }

// NotifyChannel returns the LISTEN/NOTIFY channel EnqueueTx notifies: "<schema>.keiro_outbox".
func (s *Store) NotifyChannel() string { return notifyChannel(s.schema) }

// notifyChannel is the LISTEN/NOTIFY channel of schema's outbox.
func notifyChannel(schema string) string { return schema + ".keiro_outbox" }

// Notify wakes the relays listening on the Store's channel, on q outside any transaction (a
// pool or connection), for producers built with StoreOptions.DisableNotify: call it after the
// enqueuing transaction committed. Notifications sent at once are coalesced by PostgreSQL per
// listening session, and a relay claims everything due when woken, so one call after a burst
// of commits is enough.
func (s *Store) Notify(ctx context.Context, q keiro.DB) error {
	if _, err := q.Exec(ctx, "SELECT pg_notify($1, '')", s.NotifyChannel()); err != nil {
		return fmt.Errorf("notify outbox relays: %w", err)
	}
	return nil
}

// EnqueueTx enqueues events with [Store.EnqueueTx] on the outbox that tx's search_path
// resolves, else on the outbox of schema "keiro" ([DefaultSchema]): a service whose
// search_path names no outbox writes to "keiro", and a test on a keirotest.NewDB pool, whose
// search_path is the test's schema, writes to that schema, where keirotest's assertions look
// ([ResolveSchema] is their common rule). It returns an error wrapping [ErrNoOutbox], and
// writes nothing, when neither holds an outbox table.
//
// The outbox is resolved on a connection's first enqueue and remembered with the connection;
// every later call checks it in the same round trip as its insert, and returns an error
// wrapping [ErrSearchPathChanged] if the connection's search_path now resolves another outbox
// (the transaction must then be rolled back). Services that address a schema explicitly, or
// switch schemas per transaction, enqueue through a [Store] instead.
func EnqueueTx(ctx context.Context, tx pgx.Tx, events ...envelope.Event) ([]EnqueueResult, error) {
	return defaultOutbox.enqueueTx(ctx, tx, nil, events)
}

// EnqueueTx writes events to the outbox inside the caller's transaction tx. The rows become
// visible to the relay only when tx commits, and vanish if it rolls back; the relay is woken by
// a NOTIFY that PostgreSQL delivers at commit.
//
// Every event is validated first; if any is invalid nothing is written and the joined
// problems are returned. An event without a TraceContext gets the trace context of ctx's span.
// All events are written in one round trip. Enqueuing is idempotent on (source, message id):
// an identical event already present is reported as Duplicate; one with different content is
// reported as Conflict and EnqueueTx returns an error wrapping [ErrIdentityConflict] (the
// transaction should then be rolled back). Every row takes its (source, key) transaction-scoped
// advisory lock before it gets its seq (the outbox's insert trigger does it for every writer,
// or the source's lock for a source declared with [Admin.DeclarePerSourceOrder]), so concurrent
// same-key producers serialise and their rows are published in commit order. A call with
// several keys takes their locks first, in sorted order, so that two calls never deadlock.
func (s *Store) EnqueueTx(ctx context.Context, tx pgx.Tx, events ...envelope.Event) ([]EnqueueResult, error) {
	return s.enqueueTx(ctx, tx, nil, events)
}

// EnqueueWithIDsTx is [Store.EnqueueTx] with the outbox ids chosen by the caller: ids[i] is the
// row id of events[i]. Producers that derive a deterministic id from the event's identity
// (keiro's UUIDv8 of the producer identity, events.NewProducerIdentity) use it so that the same
// event maps to the same row id in every service and language. Ids must be distinct and not
// zero. A Duplicate reports the retained row's id. The row id plays no part in ordering (the
// relay orders by the row's seq), so ids need not be time-ordered.
func (s *Store) EnqueueWithIDsTx(ctx context.Context, tx pgx.Tx, ids []envelope.UUID, events ...envelope.Event) ([]EnqueueResult, error) {
	if len(ids) != len(events) {
		return nil, fmt.Errorf("enqueue outbox events: %d outbox ids for %d events; give one id per event", len(ids), len(events))
	}
	seen := make(map[envelope.UUID]int, len(ids))
	for i, id := range ids {
		if id.IsZero() {
			return nil, fmt.Errorf("enqueue outbox events: outbox id %d is the zero UUID; derive one or use EnqueueTx", i)
		}
		if j, ok := seen[id]; ok {
			return nil, fmt.Errorf("enqueue outbox events: events %d and %d have the same outbox id %s", j, i, id)
		}
		seen[id] = i
	}
	return s.enqueueTx(ctx, tx, ids, events)
}

// enqueueTx is EnqueueTx with caller-chosen outbox ids (ids[i] for events[i]; nil: fresh UUIDv7s).
func (s *Store) enqueueTx(ctx context.Context, tx pgx.Tx, ids []envelope.UUID, events []envelope.Event) ([]EnqueueResult, error) {
	return s.enqueueCheckedTx(ctx, tx, ids, events, nil)
}

// enqueueCheckedTx is enqueueTx with, if check is set, check's query pipelined after the
// enqueue statement (one round trip) and its verdict returned before any result.
func (s *Store) enqueueCheckedTx(ctx context.Context, tx pgx.Tx, ids []envelope.UUID, events []envelope.Event,
	check *pathCheck) ([]EnqueueResult, error) {
	if len(events) == 0 {
		return nil, nil
	}
	var problems []error
	for i := range events {
		if err := events[i].Validate(); err != nil {
			problems = append(problems, fmt.Errorf("event %d (message id %q): %w", i, events[i].MessageID, err))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("enqueue outbox events: %w", errors.Join(problems...))
	}
	var ambient *envelope.TraceContext
	size := 0
	for i := range events {
		size += len(events[i].Payload)
	}
	a := newEnqueueArgs(len(events), size)
	for i := range events {
		e := &events[i]
		tc := e.TraceContext
		if tc == nil {
			if ambient == nil {
				ambient = tracing.FromContext(ctx)
			}
			tc = ambient
		}
		id := envelope.NewUUIDv7()
		if ids != nil {
			id = ids[i]
		}
		a.add(id, e, tc)
	}
	inserted, err := s.insert(ctx, tx, a, severalKeys(events), !s.opts.DisableNotify, check)
	if err != nil {
		return nil, err
	}
	results := make([]EnqueueResult, len(events))
	var missing []int
	for i := range events {
		results[i] = EnqueueResult{OutboxID: envelope.UUID(a.ids[i]), MessageID: events[i].MessageID, Outcome: Inserted}
		if _, ok := inserted[a.ids[i]]; !ok {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		results, err = s.resolveExisting(ctx, tx, events, results, missing)
	}
	s.count(ctx, events, results)
	return results, err
}

// insert runs the enqueue statement of a's events (and check's query after it, in the same
// round trip) and returns the ids of the rows it inserted. One event binds its columns as
// scalars (EnqueueOne), several as arrays (EnqueueMany).
//
// Each mode has its statement (sqlq's sqlEnqueue and sqlEnqueueLog), which reads the schema's
// mode itself, inserts nothing in the other mode and tells the mode in its last row. The Store
// runs the statement of the mode its last call found (claim at first); when the schema is in
// the other mode, the call runs the other statement in the same transaction. The mode switch
// cannot come between the two: the first statement's lock on keiro_outbox holds it back until
// the transaction ends.
func (s *Store) insert(ctx context.Context, tx pgx.Tx, a *enqueueArgs, lockKeys, notify bool, check *pathCheck) (map[[16]byte]struct{}, error) {
	logMode := s.logEnqueue.Load()
	inserted, isLog, err := s.runInsert(ctx, tx, s.enqueueStatement(logMode, a, lockKeys, notify), check)
	if err != nil {
		return nil, err
	}
	if isLog != logMode {
		s.logEnqueue.Store(isLog)
		if inserted, _, err = s.runInsert(ctx, tx, s.enqueueStatement(isLog, a, lockKeys, notify), nil); err != nil {
			return nil, err
		}
	}
	return inserted, nil
}

// enqueueStatement is the enqueue statement of a mode and its parameters: log mode's
// (sqlEnqueueLog, after its lock) or claim mode's (sqlEnqueue), for one event or several.
func (s *Store) enqueueStatement(logMode bool, a *enqueueArgs, lockKeys, notify bool) enqueueStmt {
	one, many := s.q.EnqueueOne, s.q.EnqueueMany
	if logMode {
		one, many = s.q.EnqueueLogOne, s.q.EnqueueLogMany
	}
	st := enqueueStmt{query: one, rows: len(a.ids)}
	if st.rows == 1 {
		st.args = a.scalarArgs(notify)
	} else {
		st.query, st.args = many, a.args(lockKeys, notify)
	}
	if logMode { // no key locks ($23) and no NOTIFY ($24) in log mode
		st.fence = s.q.LockOutbox
		st.args = st.args[:enqueueColumns:enqueueColumns]
		if st.rows > 1 {
			st.args = append(st.args, a.payload())
		}
	}
	return st
}

// enqueueColumns is the number of an event's columns, the enqueue statements' first parameters.
const enqueueColumns = 22

// enqueueStmt is an enqueue statement with its parameters and the number of its events, and
// the statement that takes keiro_outbox's ROW EXCLUSIVE lock before it (log mode's), if any.
type enqueueStmt struct {
	fence string
	query string
	args  []any
	rows  int
}

// runInsert runs an enqueueStatement (after its fence, and with check's query after it, in the
// same round trip) and returns the ids it inserted and whether it found the schema in log mode.
func (s *Store) runInsert(ctx context.Context, tx pgx.Tx, stmt enqueueStmt, check *pathCheck) (map[[16]byte]struct{}, bool, error) {
	if stmt.fence == "" && check == nil {
		rows, err := tx.Query(ctx, stmt.query, stmt.args...)
		if err != nil {
			return nil, false, enqueueError(err)
		}
		return insertedIDs(rows, stmt.rows)
	}
	b := &pgx.Batch{}
	if stmt.fence != "" {
		b.Queue(stmt.fence)
	}
	b.Queue(stmt.query, stmt.args...)
	if check != nil {
		b.Queue(check.query, check.args...)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if stmt.fence != "" {
		if _, err := br.Exec(); err != nil {
			return nil, false, enqueueError(err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, false, enqueueError(err)
	}
	inserted, isLog, err := insertedIDs(rows, stmt.rows)
	if err != nil {
		return nil, false, err
	}
	if check != nil {
		var found *string
		if err := br.QueryRow().Scan(&found); err != nil {
			return nil, false, fmt.Errorf("enqueue outbox events: find the outbox table on the search_path: %w", err)
		}
		if err := check.verify(found); err != nil {
			return nil, false, err
		}
	}
	if err := br.Close(); err != nil {
		return nil, false, enqueueError(err)
	}
	return inserted, isLog, nil
}

// insertedIDs reads the ids an enqueue statement returns, and its mode row: a NULL id, with 1
// in log mode.
func insertedIDs(rows pgx.Rows, n int) (map[[16]byte]struct{}, bool, error) {
	defer rows.Close()
	inserted := make(map[[16]byte]struct{}, n)
	var isLog bool
	for rows.Next() {
		var id *[16]byte
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			return nil, false, enqueueError(err)
		}
		if id == nil {
			isLog = n == 1
			continue
		}
		inserted[*id] = struct{}{}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, enqueueError(err)
	}
	return inserted, isLog, nil
}

// severalKeys reports whether events name more than one keyed (source, key). Only then does
// EnqueueTx take the key locks itself, in sorted order: the insert trigger takes each row's
// lock in row order, which is deadlock-free for one key but not for several keys that another
// transaction locks in another order. For one key the trigger's lock is the only one taken.
func severalKeys(events []envelope.Event) bool {
	var first *envelope.Event
	for i := range events {
		e := &events[i]
		if e.Key == nil {
			continue
		}
		if first == nil {
			first = e
		} else if e.Source != first.Source || *e.Key != *first.Key {
			return true
		}
	}
	return false
}

// count adds the results to keiro.outbox.enqueued, per source and outcome.
func (s *Store) count(ctx context.Context, events []envelope.Event, results []EnqueueResult) {
	if results == nil {
		return
	}
	type k struct {
		source  string
		outcome EnqueueOutcome
	}
	n := map[k]int64{}
	for i, r := range results {
		n[k{events[i].Source, r.Outcome}]++
	}
	for key, c := range n {
		s.inst.Enqueued.Add(ctx, c, metric.WithAttributeSet(attribute.NewSet(
			tracing.SourceKey.String(key.source), tracing.OutcomeKey.String(key.outcome.String()))))
	}
}

// resolveExisting classifies the events that were not inserted as Duplicate or Conflict by
// comparing them with the retained rows.
func (s *Store) resolveExisting(ctx context.Context, tx pgx.Tx, events []envelope.Event,
	results []EnqueueResult, missing []int) ([]EnqueueResult, error) {
	srcs := make([]string, len(missing))
	mids := make([]string, len(missing))
	for j, i := range missing {
		srcs[j], mids[j] = events[i].Source, events[i].MessageID
	}
	rows, err := tx.Query(ctx, s.q.EnqueueExistingRows, srcs, mids)
	if err != nil {
		return nil, fmt.Errorf("enqueue outbox events: read existing rows: %w", err)
	}
	type ident struct{ source, messageID string }
	existing := make(map[ident]storedEvent, len(missing))
	for rows.Next() {
		var r storedEvent
		if err := r.scan(rows); err != nil {
			rows.Close()
			return nil, fmt.Errorf("enqueue outbox events: read existing rows: %w", err)
		}
		existing[ident{r.ev.Source, r.ev.MessageID}] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("enqueue outbox events: read existing rows: %w", err)
	}
	var conflicts []error
	for _, i := range missing {
		r, ok := existing[ident{events[i].Source, events[i].MessageID}]
		if !ok {
			return nil, fmt.Errorf("enqueue outbox events: message %q of source %q was neither inserted nor found",
				events[i].MessageID, events[i].Source)
		}
		results[i].OutboxID = r.id
		if fields := conflictFields(&events[i], &r.ev); len(fields) > 0 {
			results[i].Outcome = Conflict
			conflicts = append(conflicts, &IdentityConflictError{Source: events[i].Source, MessageID: events[i].MessageID, Fields: fields})
		} else {
			results[i].Outcome = Duplicate
		}
	}
	if len(conflicts) > 0 {
		return results, fmt.Errorf("enqueue outbox events: %w", errors.Join(conflicts...))
	}
	return results, nil
}

// enqueueArgs are the column arrays of one enqueue statement.
type enqueueArgs struct {
	ids                                       [][16]byte
	messageID, source, destination, eventType []string
	key                                       []*string
	schemaVersion                             []int64
	contentType                               []string
	registry, subject, fingerprint            []*string
	versionRef, schemaID                      []*int64
	sourceEventID, causationID, correlationID []*[16]byte
	sourceGlobalPosition                      []*int64
	traceparent, tracestate                   []*string
	payloads                                  []byte  // every payload, one after the other
	spans                                     []int64 // each payload's offset << 32 | length
	attributes                                []*string
	occurredAt                                []time.Time
}

// newEnqueueArgs returns the arguments of n events whose payloads add up to size bytes.
func newEnqueueArgs(n, size int) *enqueueArgs {
	return &enqueueArgs{payloads: make([]byte, 0, size),
		ids: make([][16]byte, 0, n), messageID: make([]string, 0, n), source: make([]string, 0, n),
		destination: make([]string, 0, n), eventType: make([]string, 0, n), key: make([]*string, 0, n),
		schemaVersion: make([]int64, 0, n), contentType: make([]string, 0, n),
		spans: make([]int64, 0, n), occurredAt: make([]time.Time, 0, n),
	}
}

func uuidPtr(u *envelope.UUID) *[16]byte {
	if u == nil {
		return nil
	}
	b := [16]byte(*u)
	return &b
}

func (a *enqueueArgs) add(id envelope.UUID, e *envelope.Event, tc *envelope.TraceContext) {
	a.ids = append(a.ids, id)
	a.messageID = append(a.messageID, e.MessageID)
	a.source = append(a.source, e.Source)
	a.destination = append(a.destination, e.Destination)
	a.key = append(a.key, e.Key)
	a.eventType = append(a.eventType, e.EventType)
	a.schemaVersion = append(a.schemaVersion, e.SchemaVersion)
	a.contentType = append(a.contentType, e.ContentType)
	var ref envelope.SchemaRef
	if e.SchemaRef != nil {
		ref = *e.SchemaRef
	}
	a.registry = append(a.registry, ref.Registry)
	a.subject = append(a.subject, ref.Subject)
	a.versionRef = append(a.versionRef, ref.Version)
	a.schemaID = append(a.schemaID, ref.SchemaID)
	a.fingerprint = append(a.fingerprint, ref.Fingerprint)
	a.sourceEventID = append(a.sourceEventID, uuidPtr(e.SourceEventID))
	a.sourceGlobalPosition = append(a.sourceGlobalPosition, e.SourceGlobalPosition)
	a.causationID = append(a.causationID, uuidPtr(e.CausationID))
	a.correlationID = append(a.correlationID, uuidPtr(e.CorrelationID))
	var parent, state *string
	if tc != nil && tc.Traceparent != "" {
		parent = &tc.Traceparent
		if tc.Tracestate != "" {
			state = &tc.Tracestate
		}
	}
	a.traceparent = append(a.traceparent, parent)
	a.tracestate = append(a.tracestate, state)
	a.spans = append(a.spans, int64(len(a.payloads))<<32|int64(len(e.Payload)))
	a.payloads = append(a.payloads, e.Payload...)
	var attrs *string
	if e.Attributes != nil {
		s := string(e.Attributes)
		attrs = &s
	}
	a.attributes = append(a.attributes, attrs)
	a.occurredAt = append(a.occurredAt, e.OccurredAt)
}

// scalarArgs are the parameters of EnqueueOne: the columns of a's only event. One event takes
// its key's lock in the insert trigger alone, so $23 is false.
func (a *enqueueArgs) scalarArgs(notify bool) []any {
	return []any{a.ids[0], a.messageID[0], a.source[0], a.destination[0], a.key[0], a.eventType[0],
		a.schemaVersion[0], a.contentType[0], a.registry[0], a.subject[0], a.versionRef[0],
		a.schemaID[0], a.fingerprint[0], a.sourceEventID[0], a.sourceGlobalPosition[0],
		a.causationID[0], a.correlationID[0], a.traceparent[0], a.tracestate[0], a.payload(),
		a.attributes[0], a.occurredAt[0], false, notify}
}

// payload is a's payloads, one after the other (the only one's, for one event): never nil,
// since payload_bytes is never NULL.
func (a *enqueueArgs) payload() []byte {
	if a.payloads == nil {
		return []byte{}
	}
	return a.payloads
}

// args are the parameters of EnqueueMany: the columns' arrays, the flags, and the payloads
// ($25, sqlq's sqlEnqueueMany).
func (a *enqueueArgs) args(lockKeys, notify bool) []any {
	return []any{a.ids, a.messageID, a.source, a.destination, a.key, a.eventType, a.schemaVersion,
		a.contentType, a.registry, a.subject, a.versionRef, a.schemaID, a.fingerprint,
		a.sourceEventID, a.sourceGlobalPosition, a.causationID, a.correlationID,
		a.traceparent, a.tracestate, a.spans, a.attributes, a.occurredAt, lockKeys, notify, a.payload()}
}

// storedEvent is an outbox row's event columns.
type storedEvent struct {
	id envelope.UUID
	ev envelope.Event
}

// scan reads one row of sqlq.RowColumns (sqlq.Queries.EnqueueExistingRows).
func (r *storedEvent) scan(row pgx.Row) error {
	x, err := scanRow(row)
	if err != nil {
		return err
	}
	r.id, r.ev = x.OutboxID, x.Event
	return nil
}

// conflictFields names the field classes in which the new event differs from the stored one
// (keiro's ConflictField classes). The trace class is compared only when the new event carries
// its own TraceContext: a retry from another request naturally has another ambient trace.
func conflictFields(n, old *envelope.Event) []string {
	var f []string
	if n.Destination != old.Destination || !eqPtr(n.Key, old.Key) {
		f = append(f, "routing")
	}
	var nr, or envelope.SchemaRef
	if n.SchemaRef != nil {
		nr = *n.SchemaRef
	}
	if old.SchemaRef != nil {
		or = *old.SchemaRef
	}
	if n.EventType != old.EventType || n.SchemaVersion != old.SchemaVersion || n.ContentType != old.ContentType ||
		!eqPtr(nr.Registry, or.Registry) || !eqPtr(nr.Subject, or.Subject) || !eqPtr(nr.Version, or.Version) ||
		!eqPtr(nr.SchemaID, or.SchemaID) || !eqPtr(nr.Fingerprint, or.Fingerprint) {
		f = append(f, "schema")
	}
	if !bytes.Equal(n.Payload, old.Payload) {
		f = append(f, "payload")
	}
	if !n.OccurredAt.Truncate(time.Microsecond).Equal(old.OccurredAt) {
		f = append(f, "occurred_at")
	}
	if !eqPtr(n.CausationID, old.CausationID) || !eqPtr(n.CorrelationID, old.CorrelationID) {
		f = append(f, "causal")
	}
	if n.TraceContext != nil && (old.TraceContext == nil || *n.TraceContext != *old.TraceContext) {
		f = append(f, "trace")
	}
	if !jsonEqual(n.Attributes, old.Attributes) {
		f = append(f, "attributes")
	}
	if !eqPtr(n.SourceEventID, old.SourceEventID) || !eqPtr(n.SourceGlobalPosition, old.SourceGlobalPosition) {
		f = append(f, "provenance")
	}
	return f
}

func eqPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

func jsonEqual(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(x, y)
}

// enqueueError wraps an enqueue statement's error, naming an outbox id collision.
func enqueueError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "keiro_outbox_pkey" {
		return fmt.Errorf("enqueue outbox events: %w (%s); the transaction is aborted: %w", ErrOutboxIDTaken, pgErr.Detail, err)
	}
	return fmt.Errorf("enqueue outbox events: %w", err)
}

// The package-level EnqueueTx writes to the outbox its transaction's search_path resolves, else
// to schema "keiro": the rule keirotest's assertions follow too (through ResolveSchema), so a
// test on a keirotest.NewDB pool, whose search_path is the test's schema, asserts on the rows it
// wrote, and a service in production, whose search_path names no outbox, writes to "keiro".

// ErrNoOutbox reports that the package-level EnqueueTx (or ResolveSchema) found no outbox
// table: the search_path resolves no keiro_outbox and schema "keiro" has none. Migrate schema
// "keiro", put a migrated schema on the connection's search_path, or enqueue through a Store
// that names its schema (NewStore).
var ErrNoOutbox = errors.New("outbox: no outbox table on the search_path or in schema \"keiro\"")

// ErrSearchPathChanged reports a package-level EnqueueTx on a connection whose search_path
// resolves another outbox than the one it resolved on the connection's first enqueue, where
// the call's rows were written. The transaction must be rolled back; a retry on the same
// connection writes to the outbox the search_path resolves now. A connection's search_path
// should be set once (in the connection string); a service that switches schemas per
// transaction enqueues through one Store per schema.
var ErrSearchPathChanged = errors.New("outbox: the connection's search_path resolves another outbox than on its first enqueue")

// sqlResolveSchema returns the schema of the keiro_outbox table that the session's
// search_path resolves, else $1 if that schema holds a keiro_outbox, else NULL. Always one row.
const sqlResolveSchema = `SELECT coalesce(
    (SELECT n.nspname::text FROM pg_catalog.pg_class c
     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = to_regclass('keiro_outbox')),
    CASE WHEN to_regclass(quote_ident($1::text) || '.keiro_outbox') IS NOT NULL THEN $1::text END)`

// ResolveSchema returns the schema whose outbox the package-level EnqueueTx writes to through
// q: the schema of the keiro_outbox table that q's search_path resolves (a keirotest.NewDB
// pool's schema), else DefaultSchema. keirotest's assertions find the outbox the same way. It
// returns an error wrapping ErrNoOutbox when neither holds an outbox table.
func ResolveSchema(ctx context.Context, q keiro.DB) (string, error) {
	return defaultOutbox.resolve(ctx, q)
}

// searchPathOutbox is the outbox of the package-level EnqueueTx: the one the transaction's
// search_path resolves, else the one of schema fallback.
//
// Resolving costs a round trip, so it is done once per connection and remembered in the
// connection's CustomData. Every later call checks the remembered schema in the same round
// trip as its insert (the check is pipelined after the enqueue statement), so a connection
// whose search_path changes is reported (ErrSearchPathChanged) instead of writing to another
// schema's outbox unnoticed.
type searchPathOutbox struct {
	fallback string
	stores   sync.Map // schema -> *Store
}

// defaultOutbox serves the package-level EnqueueTx.
var defaultOutbox = &searchPathOutbox{fallback: DefaultSchema}

// connSchemaKey is the CustomData key under which a connection remembers its resolved schema.
const connSchemaKey = "github.com/keiro-go/keiro/outbox.schema"

// resolve runs sqlResolveSchema on q.
func (o *searchPathOutbox) resolve(ctx context.Context, q keiro.DB) (string, error) {
	var found *string
	if err := q.QueryRow(ctx, sqlResolveSchema, o.fallback).Scan(&found); err != nil {
		return "", fmt.Errorf("find the outbox table on the search_path: %w", err)
	}
	if found == nil {
		return "", o.noOutbox()
	}
	return *found, nil
}

// noOutbox is the ErrNoOutbox error, with what to do.
func (o *searchPathOutbox) noOutbox() error {
	return fmt.Errorf("%w: the search_path resolves no keiro_outbox table and schema %q has none; migrate schema %q "+
		"(relay migrate), put a migrated schema on the connection's search_path (keirotest.NewDB's pools have one), "+
		"or enqueue through outbox.NewStore(schema)", ErrNoOutbox, o.fallback, o.fallback)
}

// store returns the Store of schema, creating it on first use.
func (o *searchPathOutbox) store(schema string) (*Store, error) {
	if st, ok := o.stores.Load(schema); ok {
		return st.(*Store), nil
	}
	st, err := NewStore(schema)
	if err != nil {
		return nil, fmt.Errorf("the search_path resolves the outbox of schema %q, which EnqueueTx cannot address "+
			"(%w); enqueue through a Store of a schema it accepts", schema, err)
	}
	actual, _ := o.stores.LoadOrStore(schema, st)
	return actual.(*Store), nil
}

// enqueueTx is Store.enqueueTx on the outbox tx resolves.
func (o *searchPathOutbox) enqueueTx(ctx context.Context, tx pgx.Tx, ids []envelope.UUID, events []envelope.Event) ([]EnqueueResult, error) {
	if len(events) == 0 {
		return nil, nil
	}
	var data map[string]any
	if c := tx.Conn(); c != nil {
		data = c.PgConn().CustomData()
	}
	schema, remembered := data[connSchemaKey].(string)
	if !remembered {
		var err error
		if schema, err = o.resolve(ctx, tx); err != nil {
			return nil, fmt.Errorf("enqueue outbox events: %w", err)
		}
		if data != nil {
			data[connSchemaKey] = schema
		}
	}
	st, err := o.store(schema)
	if err != nil {
		return nil, fmt.Errorf("enqueue outbox events: %w", err)
	}
	var check *pathCheck
	if remembered {
		check = &pathCheck{query: sqlResolveSchema, args: []any{o.fallback}, verify: func(found *string) error {
			if found != nil && *found == schema {
				return nil
			}
			if found == nil {
				delete(data, connSchemaKey)
				return fmt.Errorf("enqueue outbox events: %w: this call wrote to the outbox of schema %q, which the "+
					"connection resolved first; now %v; roll the transaction back", ErrSearchPathChanged, schema, o.noOutbox())
			}
			data[connSchemaKey] = *found
			return fmt.Errorf("enqueue outbox events: %w: this call wrote to the outbox of schema %q, which the "+
				"connection resolved first, but its search_path now resolves schema %q; roll the transaction back "+
				"and retry (the connection now writes to %q), or enqueue through outbox.NewStore(schema)",
				ErrSearchPathChanged, schema, *found, *found)
		}}
	}
	res, err := st.enqueueCheckedTx(ctx, tx, ids, events, check)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateUndefinedTable {
		// The outbox the connection resolved was dropped since (a test's schema, say).
		delete(data, connSchemaKey)
		return nil, fmt.Errorf("enqueue outbox events: %w: the outbox of schema %q, which the connection resolved, "+
			"no longer exists; roll the transaction back and retry: %w", ErrNoOutbox, schema, err)
	}
	return res, err
}

// sqlstateUndefinedTable is PostgreSQL's undefined_table error code.
const sqlstateUndefinedTable = "42P01"

// pathCheck is a query pipelined after an enqueue statement, in the same round trip, and the
// verdict on its one text column.
type pathCheck struct {
	query  string
	args   []any
	verify func(found *string) error
}

// writeDeadLetter writes ev, which Kafka refused for good with code (the Kafka error's name in
// lower case, as the claim relay's rejection_code) and errText, as a 'rejected' row of
// keiro_outbox with the outbox id of its keiro_outbox_log row, its first attempt counted. It
// reports whether it wrote the row: false when the event is already there (a replayed
// transaction's second rejection, or an event also enqueued in claim mode).
func (s *Store) writeDeadLetter(ctx context.Context, q keiro.DB, ev *envelope.Event, code, errText string) (bool, error) {
	a := newEnqueueArgs(1, len(ev.Payload))
	a.add(envelope.NewUUIDv7(), ev, ev.TraceContext)
	args := append(a.scalarArgs(false)[:enqueueColumns], code, errText)
	rows, err := q.Query(ctx, s.q.DeadLetter, args...)
	if err != nil {
		return false, fmt.Errorf("write the dead letter of message %s: %w", ev.MessageID, err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("write the dead letter of message %s: %w", ev.MessageID, err)
	}
	return n > 0, nil
}
