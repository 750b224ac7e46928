package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/pgtext"
	"github.com/keiro-go/keiro/outbox/internal/logmsg"
	"github.com/keiro-go/keiro/tracing"
)

// ErrEmitNeedsLogMode reports an EmitTx on a schema in claim mode: only a log-mode relay reads
// emitted events, so EmitTx wrote nothing and refused rather than lose them. Roll the
// transaction back and enqueue with EnqueueTx, or switch the schema to log mode first (`relay
// mode set log`, or a relay run with --mode=log).
var ErrEmitNeedsLogMode = errors.New("outbox: EmitTx needs the schema in log mode")

// ErrEmitIsolation reports an EmitTx in a transaction at REPEATABLE READ or SERIALIZABLE:
// such a transaction reads the schema's mode from a snapshot that may be older than a switch
// back to claim mode, and could emit events that no relay reads. EmitTx wrote nothing. Emit
// at READ COMMITTED (PostgreSQL's default), or enqueue with EnqueueTx.
var ErrEmitIsolation = errors.New("outbox: EmitTx needs a READ COMMITTED transaction")

// EmitTx writes events for the log-mode relay inside the caller's transaction tx, each as a
// transactional logical decoding message (pg_logical_emit_message) instead of a row: the
// cheapest enqueue there is, at the price of idempotence and of every copy outside the WAL.
// It is an explicit opt-in beside EnqueueTx, which stays the default.
//
// The events become visible to the relay only when tx commits, and vanish if it rolls back:
// PostgreSQL decodes transactional messages at commit, in commit order with the transaction's
// inserts, so the relay publishes them exactly as rows of keiro_outbox_log (the same headers,
// destinations, per-key order in commit order with EnqueueTx's events, dead letters and
// exactly-once publication). Every event is validated first, as EnqueueTx's would be stored
// (Validate, and no NUL character in its text nor \u0000 in its attributes, which no row could
// hold); if any is invalid nothing is written and the joined problems are returned. An event without a TraceContext gets the
// trace context of ctx's span. All events are written in one round trip.
//
// What it gives up, compared with EnqueueTx:
//   - No duplicate detection: nothing is stored to compare with, so a retried transaction
//     that had committed publishes its events again (consumers deduplicate on the message id,
//     as the inbox does), and no Duplicate or Conflict is ever reported.
//   - No copy outside the WAL: an event exists only in the WAL until the relay's slot confirms
//     it. A slot that is lost (dropped, invalidated past max_slot_wal_keep_size, not carried
//     over by a failover) loses its unconfirmed emitted events for good; Admin.RecoverLog
//     finds only rows.
//   - Nothing to list: the console, ListOutbox and Lookup never see an emitted event until a
//     relay dead-letters it (a dead letter is a row of keiro_outbox like any other).
//   - Log mode only: the schema must be in log mode with a log-mode relay following it.
//     EmitTx reads the mode in its statement, after the lock that the mode switch waits for,
//     as EnqueueTx does: on a schema in claim mode it writes nothing and returns an error
//     wrapping ErrEmitNeedsLogMode, and a switch back to claim waits for the transaction, so
//     every emitted event is in the slot before the switch's WAL position, which the log-mode
//     relay publishes before it may be stopped. At REPEATABLE READ or SERIALIZABLE it writes
//     nothing and returns an error wrapping ErrEmitIsolation.
//
// The transaction should be rolled back after any error. The messages' prefix names the
// Store's schema ("keiro.outbox:<schema>"), so relays of other schemas ignore them.
func (s *Store) EmitTx(ctx context.Context, tx pgx.Tx, events ...envelope.Event) error {
	if len(events) == 0 {
		return nil
	}
	var problems []error
	size := 0
	var ambient *envelope.TraceContext
	for i := range events {
		e := &events[i]
		if err := e.Validate(); err != nil {
			problems = append(problems, fmt.Errorf("event %d (message id %q): %w", i, e.MessageID, err))
		}
		if err := rowStorable(e); err != nil {
			problems = append(problems, fmt.Errorf("event %d (message id %q): %w", i, e.MessageID, err))
		}
		tc := e.TraceContext
		if tc == nil {
			if ambient == nil {
				ambient = tracing.FromContext(ctx)
			}
			tc = ambient
		}
		size += logmsg.Size(e, tc)
	}
	if len(problems) > 0 {
		return fmt.Errorf("emit outbox events: %w", errors.Join(problems...))
	}
	content := make([]byte, 0, size)
	var spans []int64
	if len(events) > 1 {
		spans = make([]int64, 0, len(events))
	}
	for i := range events {
		e := &events[i]
		tc := e.TraceContext
		if tc == nil {
			tc = ambient
		}
		off := len(content)
		content = logmsg.Append(content, e, tc)
		if spans != nil {
			spans = append(spans, int64(off)<<32|int64(len(content)-off))
		}
	}
	b := &pgx.Batch{}
	b.Queue(s.q.LockOutbox)
	if spans == nil {
		b.Queue(s.q.EmitOne, s.prefix, content)
	} else {
		b.Queue(s.q.EmitMany, s.prefix, content, spans)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("emit outbox events: %w", err)
	}
	var logMode, readCommitted bool
	var n int64
	if err := br.QueryRow().Scan(&logMode, &readCommitted, &n); err != nil {
		return fmt.Errorf("emit outbox events: %w", err)
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("emit outbox events: %w", err)
	}
	switch {
	case !logMode:
		return fmt.Errorf("emit outbox events: %w: schema %q is in claim mode, whose relays read no emitted event; "+
			"nothing was written: roll back and enqueue with EnqueueTx, or switch the schema to log mode (relay mode set log)",
			ErrEmitNeedsLogMode, s.schema)
	case !readCommitted:
		return fmt.Errorf("emit outbox events: %w: the transaction's snapshot may predate a switch of the schema's mode; "+
			"nothing was written: emit at READ COMMITTED or enqueue with EnqueueTx", ErrEmitIsolation)
	case n != int64(len(events)):
		return fmt.Errorf("emit outbox events: %d of %d events written", n, len(events))
	}
	s.countEmitted(ctx, events)
	return nil
}

// countEmitted adds events to keiro.outbox.enqueued, per source, with outcome
// tracing.OutcomeEmitted.
func (s *Store) countEmitted(ctx context.Context, events []envelope.Event) {
	n := map[string]int64{}
	for i := range events {
		n[events[i].Source]++
	}
	for source, c := range n {
		s.inst.Enqueued.Add(ctx, c, metric.WithAttributeSet(attribute.NewSet(
			tracing.SourceKey.String(source), tracing.OutcomeKey.String(tracing.OutcomeEmitted))))
	}
}

// rowStorable reports what of e no row of keiro_outbox could hold, beyond what Validate checks:
// a NUL character in a text field (PostgreSQL's text refuses it) or \u0000 in the attributes
// (jsonb refuses it). EnqueueTx meets the same refusal from PostgreSQL; EmitTx checks it
// itself, since its messages are not typed columns, and an event no row can hold could not be
// dead-lettered either.
func rowStorable(e *envelope.Event) error {
	var errs []error
	text := func(field, v string) {
		if strings.IndexByte(v, 0) >= 0 {
			errs = append(errs, fmt.Errorf("%s holds a NUL character, which PostgreSQL text cannot store", field))
		}
	}
	textPtr := func(field string, v *string) {
		if v != nil {
			text(field, *v)
		}
	}
	text("MessageID", e.MessageID)
	text("Source", e.Source)
	textPtr("Key", e.Key)
	text("EventType", e.EventType)
	text("ContentType", e.ContentType)
	if r := e.SchemaRef; r != nil {
		textPtr("SchemaRef.Registry", r.Registry)
		textPtr("SchemaRef.Subject", r.Subject)
		textPtr("SchemaRef.Fingerprint", r.Fingerprint)
	}
	if tc := e.TraceContext; tc != nil {
		text("TraceContext.Traceparent", tc.Traceparent)
		text("TraceContext.Tracestate", tc.Tracestate)
	}
	if pgtext.JSONHasNUL(e.Attributes) {
		errs = append(errs, errors.New(`Attributes holds \u0000, which PostgreSQL jsonb cannot store`))
	}
	return errors.Join(errs...)
}
