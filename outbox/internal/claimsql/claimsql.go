// Package claimsql is the claim relay's statements on keiro_outbox, run by the claim engine:
// the claim of a batch under an ordering policy, the release of a lost claim's rows, the
// fenced mark of a batch's outcomes, the lease's renewal and the record of a last attempt's
// produce start. The statements themselves are in outbox/internal/sqlq.
package claimsql

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/markplan"
	"github.com/keiro-go/keiro/outbox/internal/shares"
	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

// Store runs the claim relay's statements of one schema.
type Store struct {
	// Q are the schema's statements.
	Q *sqlq.Queries
	// ClaimSent, if set (tests), runs once a claim is sent and before any of its reply is
	// read.
	ClaimSent func(q BatchSender, token envelope.UUID)
	// WalkDeep, if set (benchmarks), makes the unbounded claim of the per-key policies walk
	// the backlog in seq order as it used to, instead of finding the heads by key.
	WalkDeep bool
	// Txn is the Kafka transactional id of an exactly-once relay ("" for an at-least-once
	// one): its claims write it to the rows' claim_txn, and do not re-claim the rows of
	// another exactly-once claim whose lease expired (RecoverTxn settles those). Set it
	// before the relay's claims start.
	Txn string
}

// Policy is an ordering policy (keiro §1.3.6): what a claim must respect and how a failure in
// a batch affects the rows after it.
type Policy int

const (
	// PerKeyHeadOfLine orders rows per (source, key): a row is claimed only when every earlier
	// non-terminal row of its (source, key) is claimed with it, and a failure holds back the
	// rest of its key. Rows without a key are unordered. The default.
	PerKeyHeadOfLine Policy = iota
	// PerSourceStream orders all rows of a source, whatever their key (null keys included).
	// Kafka itself orders only within a partition, so a total order needs a single-partition
	// destination. The order is commit order for sources declared with
	// Admin.DeclarePerSourceOrder; for others a transaction that commits late is published
	// after later rows of its source.
	PerSourceStream
	// StopTheLine claims like PerKeyHeadOfLine with one batch in flight and publishes row by
	// row, a flush each (keiro §1.3.5): the first failure halts the relay, no later row of the
	// batch is sent (they are skipped, attempts refunded), and Run returns an error naming the
	// row, for manual review. The slowest policy: one produce round trip per row.
	StopTheLine
	// BestEffort claims every due row, unordered: a failure affects only its own row.
	BestEffort
)

var policyNames = [...]string{"per-key", "per-source", "stop-the-line", "best-effort"}

// String returns the policy's name: "per-key", "per-source", "stop-the-line" or "best-effort".
func (p Policy) String() string {
	if p >= 0 && int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy parses a policy name as returned by Policy.String.
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if strings.EqualFold(s, n) {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown ordering policy %q (want one of %s)", s, strings.Join(policyNames[:], ", "))
}

// Valid reports whether p is one of the policies.
func (p Policy) Valid() bool { return p >= 0 && int(p) < len(policyNames) }

// Row is one row returned by a claim.
type Row struct {
	// ID is the row's outbox id, Seq its position, Attempt the attempt the claim started,
	// CreatedAt its insertion and Event its event.
	ID        envelope.UUID
	Seq       int64
	Attempt   int
	CreatedAt time.Time
	Event     envelope.Event
	// Reclaimed: the row was publishing under an expired lease.
	Reclaimed bool
	// Dead: the row was re-claimed after its lease expired with no attempt left and went dead
	// in the claim itself; it must not be published.
	Dead bool
	// Started: the row is on its last attempt and its produce start is recorded (its
	// produce_started column is set).
	Started bool
}

// Claim claims up to limit rows under policy, with a fresh claim token and a lease. Rows come
// back in seq order. A positive scanBudget restricts the claim to the first scanBudget open
// rows in seq order (the rest of the backlog is left to an unbounded claim). An unbounded claim
// of the per-key policies finds the claimable heads key by key (sqlClaimKeys): its cost follows
// the keys and the batch, not the depth of the backlog.
//
// The claim runs in its own short transaction with bitmap and sequential scans disabled, sent
// as one pipelined batch (one round trip): without statistics (a freshly loaded table) the
// planner would otherwise sort every claimable row instead of walking the claim index in seq
// order and stopping at the limit. q must not be inside a transaction.
func (s *Store) Claim(ctx context.Context, q BatchSender, policy Policy, limit int, lease time.Duration,
	maxAttempts int, destinations []string, scanBudget int) (token envelope.UUID, out []Row, err error) {
	return s.ClaimIn(ctx, q, policy, limit, lease, maxAttempts, destinations, scanBudget, shares.All, KeyCursor{})
}

// KeyCursor is a (source, key) where the per-key claim past the front (sqlClaimKeys) starts
// its walk of the keys: it looks at the keys after it only. The zero cursor starts at the first
// key. It changes only which keys a claim looks at first, never what a claim may take.
type KeyCursor struct{ Source, Key string }

// LastKey is the cursor after the keys of rows: the last (source, key) in byte order (the
// order of the C collation; under another collation a later scan may look at a few keys
// again).
func LastKey(rows []Row) KeyCursor {
	var c KeyCursor
	for _, r := range rows {
		if r.Event.Key == nil {
			continue
		}
		if k := (KeyCursor{r.Event.Source, *r.Event.Key}); k.Source > c.Source || k.Source == c.Source && k.Key > c.Key {
			c = k
		}
	}
	return c
}

// ClaimSQL is the claim statement of policy p.
func (s *Store) ClaimSQL(p Policy) string {
	switch p {
	case PerSourceStream:
		return s.Q.ClaimSource
	case BestEffort:
		return s.Q.ClaimAny
	}
	return s.Q.ClaimKey
}

// ClaimIn is Claim restricted to the rows of the claim shares in mask (internal/shares); with
// shares.All, or none, it claims from every share, exactly as Claim. The scan budget counts the
// open rows of every share: a caller restricted to a fraction of the shares scales it. An
// unbounded per-key claim looks at the keys after from first (KeyCursor).
func (s *Store) ClaimIn(ctx context.Context, q BatchSender, policy Policy, limit int, lease time.Duration,
	maxAttempts int, destinations []string, scanBudget int, mask shares.Mask, from KeyCursor) (token envelope.UUID, out []Row, err error) {
	token = envelope.NewUUIDv7()
	var dest, budget, share any
	if len(destinations) > 0 {
		dest = destinations
	}
	if scanBudget > 0 {
		budget = int64(scanBudget)
	}
	if mask != shares.All && mask != 0 {
		share = int64(mask)
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL enable_bitmapscan = off")
	b.Queue("SET LOCAL enable_seqscan = off")
	setup := 3 // BEGIN and the two settings
	if s.Txn != "" {
		b.Queue("SELECT set_config($1, $2, true)", sqlq.ClaimTxnSetting, s.Txn)
		setup++
	}
	if budget == nil && !s.WalkDeep && (policy == PerKeyHeadOfLine || policy == StopTheLine) {
		// Past the front of the backlog the heads are found by key, not by walking every
		// row behind them (sqlClaimKeys).
		b.Queue(s.Q.ClaimKeys, [16]byte(token), maxAttempts, lease.Microseconds(), limit, dest, share, from.Source, from.Key)
	} else {
		b.Queue(s.ClaimSQL(policy), [16]byte(token), maxAttempts, lease.Microseconds(), limit, dest, budget, share)
	}
	b.Queue("COMMIT")
	br := q.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("claim outbox batch: %w", cerr)
			out = nil
		}
	}()
	if s.ClaimSent != nil {
		s.ClaimSent(q, token)
	}
	for range setup {
		if _, err := br.Exec(); err != nil {
			return token, nil, fmt.Errorf("claim outbox batch: %w", err)
		}
	}
	out, err = s.ReadClaim(br)
	if err != nil {
		return token, nil, err
	}
	if _, err := br.Exec(); err != nil {
		return token, nil, fmt.Errorf("claim outbox batch: commit: %w", err)
	}
	return token, out, nil
}

// ReleaseLostClaim releases the rows still publishing under token, the token of a claim whose
// reply was lost, once its backend (pid) is gone (sqlReleaseLostClaim). alive reports that the
// backend still runs: nothing was released and the caller asks again later.
func (s *Store) ReleaseLostClaim(ctx context.Context, q BatchSender, token envelope.UUID, pid uint32) (alive bool, released int64, err error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL enable_seqscan = off") // walk the open rows, not the retained ones
	b.Queue(s.Q.ReleaseLost, [16]byte(token), int64(pid))
	b.Queue("COMMIT")
	br := q.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("release rows of a lost claim: %w", cerr)
		}
	}()
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return false, 0, fmt.Errorf("release rows of a lost claim: %w", err)
		}
	}
	if err := br.QueryRow().Scan(&alive, &released); err != nil {
		return false, 0, fmt.Errorf("release rows of a lost claim: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return false, 0, fmt.Errorf("release rows of a lost claim: commit: %w", err)
	}
	return alive, released, nil
}

// RecoverableTxns returns the transactional ids of the exactly-once claims lost with their
// relay: rows of theirs are still publishing under an expired lease (sqlRecoverableTxns).
func (s *Store) RecoverableTxns(ctx context.Context, q keiro.DB) ([]string, error) {
	rows, err := q.Query(ctx, s.Q.RecoverableTxns)
	if err != nil {
		return nil, fmt.Errorf("find lost exactly-once claims: %w", err)
	}
	txns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find lost exactly-once claims: %w", err)
	}
	return txns, nil
}

// Recovered counts the rows RecoverTxn settled.
type Recovered struct {
	// Sent counts the rows marked sent (their records committed), Released those put back
	// to pending (their records did not).
	Sent, Released int64
}

// RecoverTxn settles the rows of transactional id txn still publishing under an expired lease,
// but for those of the claims in skip (sqlRecoverTxn): the rows committed lists (claim token →
// seqs, from the id's last committed claims record, read once the id is fenced) are marked
// sent, the others released.
func (s *Store) RecoverTxn(ctx context.Context, q keiro.DB, txn string, committed map[envelope.UUID][]int64, skip []envelope.UUID) (Recovered, error) {
	var tokens [][16]byte
	var seqs []int64
	for tok, ss := range committed {
		for _, seq := range ss {
			tokens = append(tokens, tok)
			seqs = append(seqs, seq)
		}
	}
	var skipped [][16]byte
	for _, tok := range skip {
		skipped = append(skipped, tok)
	}
	rows, err := q.Query(ctx, s.Q.RecoverTxn, txn, tokens, seqs, skipped)
	if err != nil {
		return Recovered{}, fmt.Errorf("recover the lost claims of %s: %w", txn, err)
	}
	var rec Recovered
	var id [16]byte
	var sent bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &sent}, func() error {
		if sent {
			rec.Sent++
		} else {
			rec.Released++
		}
		return nil
	}); err != nil {
		return Recovered{}, fmt.Errorf("recover the lost claims of %s: %w", txn, err)
	}
	return rec, nil
}

// BatchSender sends a pipelined batch: *pgxpool.Pool and *pgx.Conn satisfy it.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ReadClaim reads the claim statement's rows.
func (s *Store) ReadClaim(br pgx.BatchResults) ([]Row, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var (
			r                              Row
			oldStatus, status              string
			id                             [16]byte
			key, registry, subject, fp     *string
			versionRef, schemaID, position *int64
			sourceEventID, causation, corr *[16]byte
			tp, ts, attrs                  *string
		)
		e := &r.Event
		if err := rows.Scan(&oldStatus, &status, &r.Seq, &r.Attempt, &r.CreatedAt,
			&id, &e.Source, &e.MessageID, &e.Destination, &key, &e.EventType,
			&e.SchemaVersion, &e.ContentType, &registry, &subject, &versionRef, &schemaID, &fp,
			&sourceEventID, &position, &causation, &corr, &tp, &ts, &e.Payload, &attrs, &e.OccurredAt); err != nil {
			return nil, fmt.Errorf("claim outbox batch: %w", err)
		}
		r.ID = id
		r.Reclaimed = oldStatus == statusPublishing
		r.Dead = status == statusDead
		FillEvent(e, key, registry, subject, fp, versionRef, schemaID, position, sourceEventID, causation, corr, tp, ts, attrs)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	return out, nil
}

// The statuses the claim reads.
const (
	statusPublishing = "publishing"
	statusDead       = "dead"
)

// Mark is one row's outcome, ready to write.
type Mark struct {
	// ID is the row; Outcome what happens to it, with Err, the retry Delay and the rejection
	// Code of a failure, the Partition and Offset of a sent row.
	ID        envelope.UUID
	Outcome   markplan.Outcome
	Err       string
	Delay     time.Duration
	Partition int32
	Offset    int64
	Code      string
	// Dest is the row's destination, for per-destination metrics (not written).
	Dest string
}

// MarkedRow is one row a mark statement moved: its id, the outcome asked for and the status it
// ended in (a failed outcome ends dead when the row had no attempt left).
type MarkedRow struct {
	// ID is the row, Outcome the outcome asked for and Status the status it ended in.
	ID      envelope.UUID
	Outcome string
	Status  string
}

// DestCounts are one destination's real transitions in a mark statement.
type DestCounts struct{ Sent, Retried, Dead, Rejected int }

// Transitions counts the rows a mark statement actually moved, by resulting state.
type Transitions struct {
	// Sent, Failed, Dead, Skipped, Released, Rejected and Deferred count the rows moved to
	// each state.
	Sent, Failed, Dead, Skipped, Released, Rejected, Deferred int
	// ByDest splits sent, retried (failed, deferred, skipped), dead and rejected per destination.
	ByDest map[string]*DestCounts
	Rows   []MarkedRow // each row moved, for the transition log
}

// Total is the number of rows moved.
func (t Transitions) Total() int {
	return t.Sent + t.Failed + t.Dead + t.Skipped + t.Released + t.Rejected + t.Deferred
}

// MarkBatch writes a batch's outcomes in one statement (so one transaction), fenced by token.
// Rows no longer publishing under token are left untouched and not counted. On error the
// statement wrote nothing, whatever rows it returned before failing (a connection lost
// mid-result, an error at commit), and the Transitions returned are empty.
func (s *Store) MarkBatch(ctx context.Context, q keiro.DB, token envelope.UUID, marks []Mark, maxAttempts int) (Transitions, error) {
	var t Transitions
	if len(marks) == 0 {
		return t, nil
	}
	n := len(marks)
	ids := make([][16]byte, n)
	outs := make([]string, n)
	errs := make([]*string, n)
	delays := make([]int64, n)
	parts := make([]int32, n)
	offs := make([]int64, n)
	codes := make([]*string, n)
	for i, m := range marks {
		ids[i] = m.ID
		outs[i] = m.Outcome.String()
		if m.Err != "" {
			errs[i] = &marks[i].Err
		}
		delays[i] = m.Delay.Microseconds()
		parts[i], offs[i] = m.Partition, m.Offset
		if m.Code != "" {
			codes[i] = &marks[i].Code
		}
	}
	sql := s.Q.Mark
	for _, m := range marks {
		if m.Outcome == markplan.Failed || m.Outcome == markplan.Rejected {
			sql = s.Q.MarkHistory // only a batch with a failure writes attempt histories
			break
		}
	}
	rows, err := q.Query(ctx, sql, [16]byte(token), ids, outs, errs, delays, parts, offs, codes, maxAttempts)
	if err != nil {
		return Transitions{}, fmt.Errorf("mark outbox batch: %w", err)
	}
	defer rows.Close()
	dest := make(map[[16]byte]string, n)
	for _, m := range marks {
		dest[m.ID] = m.Dest
	}
	t.ByDest = map[string]*DestCounts{}
	for rows.Next() {
		var id [16]byte
		var out, status string
		if err := rows.Scan(&id, &out, &status); err != nil {
			return Transitions{}, fmt.Errorf("mark outbox batch: %w", err)
		}
		t.add(MarkedRow{ID: id, Outcome: out, Status: status}, dest[id])
	}
	if err := rows.Err(); err != nil {
		return Transitions{}, fmt.Errorf("mark outbox batch: %w", err)
	}
	return t, nil
}

// add counts row, a row of destination dest that the mark moved.
func (t *Transitions) add(row MarkedRow, dest string) {
	t.Rows = append(t.Rows, row)
	d := t.ByDest[dest]
	if d == nil {
		d = &DestCounts{}
		t.ByDest[dest] = d
	}
	switch out := row.Outcome; {
	case out == "sent":
		t.Sent++
		d.Sent++
	case out == "rejected":
		t.Rejected++
		d.Rejected++
	case out == "skipped":
		t.Skipped++
		d.Retried++
	case out == "released":
		t.Released++
	case out == "deferred":
		t.Deferred++
		d.Retried++
	case row.Status == statusDead:
		t.Dead++
		d.Dead++
	default:
		t.Failed++
		d.Retried++
	}
}

// RenewLease extends the lease of the rows ids still publishing under token to lease from now,
// and returns how many it extended.
func (s *Store) RenewLease(ctx context.Context, q keiro.DB, token envelope.UUID, ids [][16]byte, lease time.Duration) (int64, error) {
	tag, err := q.Exec(ctx, s.Q.Renew, [16]byte(token), ids, lease.Microseconds())
	if err != nil {
		return 0, fmt.Errorf("renew outbox lease: %w", err)
	}
	return tag.RowsAffected(), nil
}

// StartProduce records that the produce of rows ids, on their last attempt, starts: those
// still publishing under token get produce_started (sqlStartProduce). It returns the ids it
// recorded; the others were taken over by another relay.
func (s *Store) StartProduce(ctx context.Context, q keiro.DB, token envelope.UUID, ids [][16]byte) (map[[16]byte]bool, error) {
	rows, err := q.Query(ctx, s.Q.Start, [16]byte(token), ids)
	if err != nil {
		return nil, fmt.Errorf("record outbox produce start: %w", err)
	}
	moved := make(map[[16]byte]bool, len(ids))
	var id [16]byte
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { moved[id] = true; return nil }); err != nil {
		return nil, fmt.Errorf("record outbox produce start: %w", err)
	}
	return moved, nil
}

// FillEvent sets the event's fields read from nullable columns: the claim's, and the outbox
// row codec's (outbox/rows.go).
func FillEvent(e *envelope.Event, key, registry, subject, fp *string, versionRef, schemaID, position *int64,
	sourceEventID, causation, corr *[16]byte, traceparent, tracestate, attrs *string) {
	e.Key = key
	if registry != nil || subject != nil || fp != nil || versionRef != nil || schemaID != nil {
		e.SchemaRef = &envelope.SchemaRef{Registry: registry, Subject: subject, Version: versionRef, SchemaID: schemaID, Fingerprint: fp}
	}
	e.SourceGlobalPosition = position
	toUUID := func(b *[16]byte) *envelope.UUID {
		if b == nil {
			return nil
		}
		u := envelope.UUID(*b)
		return &u
	}
	e.SourceEventID, e.CausationID, e.CorrelationID = toUUID(sourceEventID), toUUID(causation), toUUID(corr)
	if traceparent != nil {
		e.TraceContext = &envelope.TraceContext{Traceparent: *traceparent}
		if tracestate != nil {
			e.TraceContext.Tracestate = *tracestate
		}
	}
	if attrs != nil {
		e.Attributes = json.RawMessage(*attrs)
	}
	e.OccurredAt = e.OccurredAt.UTC()
}
