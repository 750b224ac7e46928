package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/schemaname"
	"github.com/keiro-go/keiro/tracing"

	"github.com/keiro-go/keiro"
)

// DefaultPageSize is the number of events a read fetches per round trip.
const DefaultPageSize = 256

// notifyCoalesce is the window in which the command runner's commits share one NOTIFY; it is
// also the most a subscription's wake-up is delayed by it.
const notifyCoalesce = 5 * time.Millisecond

// notifyTimeout bounds one asynchronous NOTIFY, so a hung database cannot keep the notifying
// goroutine alive.
const notifyTimeout = 5 * time.Second

// StoreConfig configures a Store.
type StoreConfig struct {
	// Schema is the PostgreSQL schema holding the event store tables (migrations
	// 003_events.sql and 006_events.sql). Defaults to migrations.DefaultSchema ("keiro").
	Schema string
	// PageSize is the number of events fetched per round trip by the read iterators and by
	// hydration. Defaults to DefaultPageSize.
	PageSize int
	// DisableNotify stops appends from sending a NOTIFY on NotifyChannel. Subscriptions then
	// find new events by polling only. Defaults to false (notify).
	DisableNotify bool
	// TracerProvider provides the tracer for append spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider provides the meter for the store's and runners' instruments. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Enrich rewrites every event before it is appended, on every append path: AppendTx, the
	// command runner (with hooks or without, in its own transaction or the caller's), and the
	// process managers and routers that run commands (keiro's store-level enrichEvent hook).
	// It typically stamps metadata the writers do not know, such as an actor or a tenant. An
	// error fails the append. A repeated append of caller-chosen ids is recognised by the
	// enriched type, schema version and data, so an Enrich that changes those must be
	// deterministic. Defaults to nil: events are appended as given.
	Enrich func(ctx context.Context, stream string, e EventData) (EventData, error)
}

func (c *StoreConfig) applyDefaults() {
	if c.Schema == "" {
		c.Schema = schemaname.Default
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
}

func (c *StoreConfig) validate() error {
	var errs []error
	if err := schemaname.Validate(c.Schema); err != nil {
		errs = append(errs, fmt.Errorf("Schema: %w", err))
	}
	if c.PageSize < 1 {
		errs = append(errs, fmt.Errorf("PageSize: %d is not positive", c.PageSize))
	}
	return errors.Join(errs...)
}

// Store reads and appends events in one schema. It holds no connection: every method takes the
// transaction or keiro.DB to run on. A Store is safe for concurrent use.
type Store struct {
	cfg     StoreConfig
	channel string
	q       queries
	tracer  trace.Tracer
	metrics *metrics

	notifyPending, notifyRunning atomic.Bool

	// progressMu guards progressCh, which is closed (and replaced) whenever a subscription of
	// this Store commits a checkpoint: read-model waits in this process wake on it.
	progressMu sync.Mutex
	progressCh chan struct{}
}

// progressed wakes the read-model waits blocked on progressSignal.
func (s *Store) progressed() {
	s.progressMu.Lock()
	if s.progressCh != nil {
		close(s.progressCh)
		s.progressCh = nil
	}
	s.progressMu.Unlock()
}

// progressSignal returns a channel closed at the next checkpoint commit of a subscription of
// this Store.
func (s *Store) progressSignal() <-chan struct{} {
	s.progressMu.Lock()
	defer s.progressMu.Unlock()
	if s.progressCh == nil {
		s.progressCh = make(chan struct{})
	}
	return s.progressCh
}

// NewStore returns a Store for cfg, reporting every configuration problem at once.
func NewStore(cfg StoreConfig) (*Store, error) {
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new event store: %w", err)
	}
	m, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("new event store: %w", err)
	}
	ch := notifyChannel(cfg.Schema)
	return &Store{
		cfg: cfg, channel: ch, q: newQueries(cfg.Schema, ch), metrics: m,
		tracer: cfg.TracerProvider.Tracer(instrumentationScope),
	}, nil
}

// notifyChannel is "<schema>_keiro_events", or a hashed form when that exceeds PostgreSQL's
// 63-byte identifier limit.
func notifyChannel(schema string) string {
	ch := schema + "_keiro_events"
	if len(ch) <= 63 {
		return ch
	}
	sum := sha256.Sum256([]byte(schema))
	return "keiro_events_" + hex.EncodeToString(sum[:16])
}

// notifyAsync sends a NOTIFY from a background goroutine, coalescing calls made while one is
// in flight, or within notifyCoalesce after it, into one more NOTIFY. At most one goroutine runs
// per Store; it ends as soon as no call is pending. Only a pool is used that way; through any
// other keiro.DB it notifies at once. Failures are ignored: subscriptions also poll.
func (s *Store) notifyAsync(q keiro.DB) {
	if _, ok := q.(*pgxpool.Pool); !ok {
		// A transaction or a single connection must not be used from another goroutine while
		// its caller goes on: notify now, on the caller's (inside a transaction, PostgreSQL
		// delivers it when that commits).
		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		_ = s.Notify(ctx, q)
		cancel()
		return
	}
	s.notifyPending.Store(true)
	if !s.notifyRunning.CompareAndSwap(false, true) {
		return
	}
	go func() {
		for {
			for s.notifyPending.Swap(false) {
				ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
				_ = s.Notify(ctx, q)
				cancel()
				// Let the commits of the next moment share one NOTIFY: every NOTIFY wakes every
				// listening backend of the database, and costs the committer CPU.
				t := time.NewTimer(notifyCoalesce)
				<-t.C
			}
			s.notifyRunning.Store(false)
			// A call that set pending after the loop and lost the CAS above must not be lost.
			if !s.notifyPending.Load() || !s.notifyRunning.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// Schema returns the schema the Store addresses.
func (s *Store) Schema() string { return s.cfg.Schema }

// NotifyChannel returns the LISTEN/NOTIFY channel appends notify at commit.
func (s *Store) NotifyChannel() string { return s.channel }

// ExpectedVersion is the stream state an append requires. The zero value is Any.
type ExpectedVersion struct {
	kind    expectKind
	version int64
}

type expectKind uint8

const (
	expectAny expectKind = iota
	expectNoStream
	expectStreamExists
	expectExact
)

var (
	// Any appends whatever the stream's state.
	Any = ExpectedVersion{kind: expectAny}
	// NoStream appends only if the stream has no events.
	NoStream = ExpectedVersion{kind: expectNoStream}
	// StreamExists appends only if the stream has at least one event.
	StreamExists = ExpectedVersion{kind: expectStreamExists}
)

// Exact appends only if the stream is at version n (its n-th event is the last). Exact(0) is
// NoStream.
func Exact(n int64) ExpectedVersion {
	if n <= 0 {
		return NoStream
	}
	return ExpectedVersion{kind: expectExact, version: n}
}

// String describes the expectation ("any", "no stream", "stream exists", "version 3").
func (e ExpectedVersion) String() string {
	switch e.kind {
	case expectNoStream:
		return "no stream"
	case expectStreamExists:
		return "stream exists"
	case expectExact:
		return fmt.Sprintf("version %d", e.version)
	}
	return "any"
}

// Metadata is what an event carries besides its data.
type Metadata struct {
	// CorrelationID groups the events of one business flow, if any.
	CorrelationID *envelope.UUID
	// CausationID is the id of the message or event that caused this one, if any.
	CausationID *envelope.UUID
	// TraceContext is the W3C trace context of the writing span, if any. AppendTx fills it from
	// ctx when nil.
	TraceContext *envelope.TraceContext
	// Extra is free-form JSON (an object by convention), for example {"actor":"agent-7"}. Nil
	// means none.
	Extra json.RawMessage
}

// EventData is an event to append.
type EventData struct {
	// ID is the event's globally unique id. The zero UUID means "mint a UUIDv7". A caller-chosen
	// id makes the append idempotent: appending the same id with the same content again is a
	// no-op success.
	ID envelope.UUID
	// Type is the event's type tag, for example "OrderPlaced". Required.
	Type string
	// SchemaVersion is the version of Data's schema.
	SchemaVersion int32
	// Data is the event's JSON payload. Required; it must be valid JSON.
	Data json.RawMessage
	// Metadata is the event's metadata.
	Metadata Metadata
}

// RecordedEvent is a stored event.
type RecordedEvent struct {
	// GlobalPosition is the event's position in the whole log (1-based, increasing in append
	// order; holes are possible where a transaction rolled back).
	GlobalPosition int64
	// ID is the event's unique id.
	ID envelope.UUID
	// StreamName is the event's stream.
	StreamName string
	// StreamVersion is the event's 1-based version within its stream.
	StreamVersion int64
	// Type is the event's type tag.
	Type string
	// SchemaVersion is the version of Data's schema.
	SchemaVersion int32
	// Data is the JSON payload (as normalised by PostgreSQL's jsonb).
	Data json.RawMessage
	// Metadata is the event's metadata.
	Metadata Metadata
	// RecordedAt is the appending transaction's start time.
	RecordedAt time.Time
}

// Category returns the category of the event's stream.
func (e RecordedEvent) Category() string { return Category(e.StreamName) }

// AppendResult reports an append.
type AppendResult struct {
	// StreamVersion is the stream's version after the append (the last event's version).
	StreamVersion int64
	// GlobalPosition is the last appended event's global position.
	GlobalPosition int64
	// Events are the appended events, in order, as stored.
	Events []RecordedEvent
	// Duplicate reports an idempotent repeat: every event id was already stored with the same
	// content, nothing was written, and Events are the stored events.
	Duplicate bool
}

// AppendTx appends events to stream inside the caller's transaction tx, if the stream matches
// expected. The events become visible to readers and subscriptions only when tx commits and
// vanish if it rolls back; subscriptions are woken by a NOTIFY delivered at commit. (PostgreSQL
// serialises the commits of notifying transactions on a global lock held through the WAL flush;
// writers that need many concurrent commits per second can set StoreConfig.DisableNotify and
// call Store.Notify after committing, as the command runner does.)
//
// On a version mismatch AppendTx writes nothing and returns a *WrongExpectedVersionError (the
// transaction stays usable). Events whose ID is set are idempotent: if every such id is already
// stored with the same stream, type, schema version and data, AppendTx writes nothing and
// reports Duplicate; different content, or a batch only partly stored, returns
// ErrEventIDConflict. Appends to one stream serialise on the stream's row until commit; appends
// to different streams do not contend.
func (s *Store) AppendTx(ctx context.Context, tx pgx.Tx, stream string, expected ExpectedVersion, events ...EventData) (AppendResult, error) {
	return s.appendTx(ctx, tx, stream, expected, !s.cfg.DisableNotify, events)
}

// Notify wakes the subscriptions listening on NotifyChannel. Appends notify by themselves
// unless StoreConfig.DisableNotify is set; the command runner calls Notify after its commit
// instead (see Runner.Run).
func (s *Store) Notify(ctx context.Context, q keiro.DB) error {
	if _, err := q.Exec(ctx, `SELECT pg_notify($1, '')`, s.channel); err != nil {
		return fmt.Errorf("notify %s: %w", s.channel, err)
	}
	return nil
}

func (s *Store) appendTx(ctx context.Context, tx keiro.DB, stream string, expected ExpectedVersion, notify bool, events []EventData) (res AppendResult, err error) {
	ctx, span := s.tracer.Start(ctx, "append "+Category(stream), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(tracing.StreamNameKey.String(stream), tracing.DBSystemNameKey.String("postgresql")))
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, truncate(err.Error(), 256))
		} else {
			span.SetAttributes(tracing.EventsAppendedKey.Int64(int64(len(res.Events))))
		}
		span.End()
	}()
	st, err := s.prepareAppend(ctx, stream, expected, notify, events)
	if err != nil {
		return AppendResult{}, err
	}
	if st.callerIDs {
		dup, ok, err := s.checkExisting(ctx, tx, stream, st.a)
		if err != nil {
			return AppendResult{}, err
		}
		if ok {
			return dup, nil
		}
	}
	rows, err := tx.Query(ctx, st.sql, st.args...)
	if err != nil {
		return AppendResult{}, s.appendError(stream, err)
	}
	res, err = st.scan(rows)
	if err != nil {
		return AppendResult{}, err
	}
	if len(res.Events) == 0 {
		var actual int64
		err := tx.QueryRow(ctx, s.q.streamVersion, stream).Scan(&actual)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return AppendResult{}, fmt.Errorf("append to %s: read stream version after a conflict: %w", stream, err)
		}
		return AppendResult{}, &WrongExpectedVersionError{Stream: stream, Expected: expected, Actual: actual}
	}
	return res, nil
}

// appendStatement is one append, ready to run: the statement, its arguments, and what scan
// needs to build the AppendResult.
type appendStatement struct {
	s         *Store
	stream    string
	events    []EventData
	a         *appendArgs
	callerIDs bool
	sql       string
	args      []any
}

// prepareAppend validates an append and builds its statement.
func (s *Store) prepareAppend(ctx context.Context, stream string, expected ExpectedVersion, notify bool, events []EventData) (*appendStatement, error) {
	if err := ValidateStreamName(stream); err != nil {
		return nil, fmt.Errorf("append to %s: %w", stream, err)
	}
	if len(events) == 0 {
		return nil, fmt.Errorf("append to %s: no events", stream)
	}
	if s.cfg.Enrich != nil {
		enriched := make([]EventData, len(events))
		for i, e := range events {
			var err error
			if enriched[i], err = s.cfg.Enrich(ctx, stream, e); err != nil {
				return nil, fmt.Errorf("append to %s: enrich event %d: %w", stream, i, err)
			}
		}
		events = enriched
	}
	a, callerIDs, err := newAppendArgs(ctx, events)
	if err != nil {
		return nil, fmt.Errorf("append to %s: %w", stream, err)
	}
	category := Category(stream)
	k := int64(len(events))
	var args []any
	var q string
	if k == 1 {
		args = []any{stream, category, k, a.ids[0], a.types[0], a.schemaVersions[0], a.data[0], a.metadata[0],
			a.correlation[0], a.causation[0], a.traceparent[0], a.tracestate[0], notify}
		q = [...]string{s.q.oneAny, s.q.oneNoStream, s.q.oneExists, s.q.oneExact}[expected.kind]
	} else {
		args = []any{stream, category, k, a.ids, a.types, a.schemaVersions, a.data, a.metadata,
			a.correlation, a.causation, a.traceparent, a.tracestate, notify}
		q = [...]string{s.q.streamAny, s.q.streamNoStream, s.q.streamExists, s.q.streamExact}[expected.kind]
	}
	if expected.kind == expectExact {
		args = append(args, expected.version)
	}
	return &appendStatement{s: s, stream: stream, events: events, a: a, callerIDs: callerIDs, sql: q, args: args}, nil
}

// scan reads the append statement's rows. No rows (and no error) means the expected version
// did not hold.
func (st *appendStatement) scan(rows pgx.Rows) (AppendResult, error) {
	defer rows.Close()
	var res AppendResult
	events, a, stream := st.events, st.a, st.stream
	res.Events = make([]RecordedEvent, 0, len(events))
	for rows.Next() {
		var pos, version, notified int64
		var at time.Time
		var data, meta []byte
		if err := rows.Scan(&pos, &version, &at, &notified, &data, &meta); err != nil {
			return AppendResult{}, st.s.appendError(stream, err)
		}
		i := len(res.Events)
		md := a.recordedMetadata(i)
		md.Extra = meta // as stored (nil when none)
		res.Events = append(res.Events, RecordedEvent{
			GlobalPosition: pos, ID: envelope.UUID(a.ids[i]), StreamName: stream, StreamVersion: version,
			Type: events[i].Type, SchemaVersion: events[i].SchemaVersion, Data: data,
			Metadata: md, RecordedAt: at,
		})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return AppendResult{}, st.s.appendError(stream, err)
	}
	if len(res.Events) == 0 {
		return res, nil
	}
	if len(res.Events) != len(events) {
		return AppendResult{}, fmt.Errorf("append to %s: %d of %d events inserted", stream, len(res.Events), len(events))
	}
	last := res.Events[len(res.Events)-1]
	res.StreamVersion, res.GlobalPosition = last.StreamVersion, last.GlobalPosition
	return res, nil
}

func (s *Store) appendError(stream string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "keiro_events_event_id_key" {
		// A concurrent transaction stored one of the caller's ids first; tx is now aborted.
		return fmt.Errorf("append to %s: %w (stored concurrently; the transaction is aborted): %w", stream, ErrEventIDConflict, err)
	}
	return fmt.Errorf("append to %s: %w", stream, err)
}

// checkExisting looks up caller-supplied ids. ok reports a complete identical duplicate.
func (s *Store) checkExisting(ctx context.Context, tx keiro.DB, stream string, a *appendArgs) (AppendResult, bool, error) {
	// Only the caller's ids: events without one got fresh ids, which a repeat cannot match.
	var ids [][16]byte
	var types []string
	var versions []int32
	var data []json.RawMessage
	for i, sup := range a.supplied {
		if sup {
			ids, types, versions, data = append(ids, a.ids[i]), append(types, a.types[i]), append(versions, a.schemaVersions[i]), append(data, a.data[i])
		}
	}
	rows, err := tx.Query(ctx, s.q.existingIDs, ids, stream, types, versions, data)
	if err != nil {
		return AppendResult{}, false, fmt.Errorf("append to %s: look up event ids: %w", stream, err)
	}
	var stored []RecordedEvent
	allSame := true
	for rows.Next() {
		var same bool
		ev, err := scanRecorded(rows, &same)
		if err != nil {
			rows.Close()
			return AppendResult{}, false, fmt.Errorf("append to %s: look up event ids: %w", stream, err)
		}
		allSame = allSame && same
		stored = append(stored, ev)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return AppendResult{}, false, fmt.Errorf("append to %s: look up event ids: %w", stream, err)
	}
	switch {
	case len(stored) == 0:
		return AppendResult{}, false, nil
	case !allSame:
		return AppendResult{}, false, fmt.Errorf("append to %s: %w: %s", stream, ErrEventIDConflict, idList(stored))
	case len(stored) != len(ids):
		return AppendResult{}, false, fmt.Errorf("append to %s: %w: only %d of %d ids are stored (%s)",
			stream, ErrEventIDConflict, len(stored), len(ids), idList(stored))
	}
	s.metrics.duplicates.Add(ctx, 1)
	last := stored[len(stored)-1]
	return AppendResult{StreamVersion: last.StreamVersion, GlobalPosition: last.GlobalPosition, Events: stored, Duplicate: true}, true, nil
}

func idList(evs []RecordedEvent) string {
	s := ""
	for i, e := range evs {
		if i > 0 {
			s += ", "
		}
		if i == 3 {
			return s + "…"
		}
		s += e.ID.String()
	}
	return s
}

// appendArgs are the column arrays of one append statement.
type appendArgs struct {
	ids                     [][16]byte
	types                   []string
	schemaVersions          []int32
	data, metadata          []json.RawMessage
	correlation, causation  []*[16]byte
	traceparent, tracestate []*string
	supplied                []bool // the caller chose ids[i]
}

func newAppendArgs(ctx context.Context, events []EventData) (*appendArgs, bool, error) {
	n := len(events)
	a := &appendArgs{
		ids: make([][16]byte, n), types: make([]string, n), schemaVersions: make([]int32, n),
		data: make([]json.RawMessage, n), metadata: make([]json.RawMessage, n),
		correlation: make([]*[16]byte, n), causation: make([]*[16]byte, n),
		traceparent: make([]*string, n), tracestate: make([]*string, n), supplied: make([]bool, n),
	}
	var problems []error
	callerIDs := false
	var ambient *envelope.TraceContext
	ambientDone := false
	for i := range events {
		e := &events[i]
		if e.ID.IsZero() {
			a.ids[i] = envelope.NewUUIDv7()
		} else {
			a.ids[i] = e.ID
			a.supplied[i], callerIDs = true, true
		}
		if e.Type == "" {
			problems = append(problems, fmt.Errorf("event %d: Type is empty", i))
		}
		if !json.Valid(e.Data) {
			problems = append(problems, fmt.Errorf("event %d (%s): Data is not valid JSON", i, e.Type))
		}
		if e.Metadata.Extra != nil && !json.Valid(e.Metadata.Extra) {
			problems = append(problems, fmt.Errorf("event %d (%s): Metadata.Extra is not valid JSON", i, e.Type))
		}
		a.types[i], a.schemaVersions[i], a.data[i], a.metadata[i] = e.Type, e.SchemaVersion, e.Data, e.Metadata.Extra
		a.correlation[i], a.causation[i] = uuidPtr(e.Metadata.CorrelationID), uuidPtr(e.Metadata.CausationID)
		tc := e.Metadata.TraceContext
		if tc == nil {
			if !ambientDone {
				ambient, ambientDone = tracing.FromContext(ctx), true
			}
			tc = ambient
		}
		if tc != nil && tc.Traceparent != "" {
			a.traceparent[i] = &tc.Traceparent
			if tc.Tracestate != "" {
				a.tracestate[i] = &tc.Tracestate
			}
		}
	}
	return a, callerIDs, errors.Join(problems...)
}

func (a *appendArgs) recordedMetadata(i int) Metadata {
	m := Metadata{CorrelationID: uuidFrom(a.correlation[i]), CausationID: uuidFrom(a.causation[i]), Extra: a.metadata[i]}
	if a.traceparent[i] != nil {
		m.TraceContext = &envelope.TraceContext{Traceparent: *a.traceparent[i]}
		if a.tracestate[i] != nil {
			m.TraceContext.Tracestate = *a.tracestate[i]
		}
	}
	return m
}

func uuidPtr(u *envelope.UUID) *[16]byte {
	if u == nil {
		return nil
	}
	b := [16]byte(*u)
	return &b
}

func uuidFrom(b *[16]byte) *envelope.UUID {
	if b == nil {
		return nil
	}
	u := envelope.UUID(*b)
	return &u
}

// scanRecorded scans recordedColumns, then extra destinations.
func scanRecorded(row pgx.Row, extra ...any) (RecordedEvent, error) {
	var (
		e          RecordedEvent
		id         [16]byte
		data, meta []byte
		corr, caus *[16]byte
		tp, ts     *string
	)
	dest := append([]any{&e.GlobalPosition, &id, &e.StreamName, &e.StreamVersion, &e.Type,
		&e.SchemaVersion, &data, &meta, &corr, &caus, &tp, &ts, &e.RecordedAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return RecordedEvent{}, err
	}
	e.ID = envelope.UUID(id)
	e.Data = data
	if meta != nil {
		e.Metadata.Extra = meta
	}
	e.Metadata.CorrelationID, e.Metadata.CausationID = uuidFrom(corr), uuidFrom(caus)
	if tp != nil {
		e.Metadata.TraceContext = &envelope.TraceContext{Traceparent: *tp}
		if ts != nil {
			e.Metadata.TraceContext.Tracestate = *ts
		}
	}
	return e, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
