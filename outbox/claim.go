package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/markplan"
	"github.com/keiro-go/keiro/outbox/internal/shares"
)

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
	// [Admin.DeclarePerSourceOrder]; for others a transaction that commits late is published
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

// ParsePolicy parses a policy name as returned by [Policy.String].
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if strings.EqualFold(s, n) {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown ordering policy %q (want one of %s)", s, strings.Join(policyNames[:], ", "))
}

func (p Policy) valid() bool { return p >= 0 && int(p) < len(policyNames) }

// claimedRow is one row returned by a claim.
type claimedRow struct {
	id        envelope.UUID
	seq       int64
	attempt   int
	createdAt time.Time
	event     envelope.Event
	// reclaimed: the row was publishing under an expired lease.
	reclaimed bool
	// dead: the row was re-claimed after its lease expired with no attempt left and went dead
	// in the claim itself; it must not be published.
	dead bool
	// started: the row is on its last attempt and its produce start is recorded (its
	// produce_started column is set).
	started bool
}

// claim claims up to limit rows under policy, with a fresh claim token and a lease. Rows come
// back in seq order. A positive scanBudget restricts the claim to the first scanBudget open
// rows in seq order (the rest of the backlog is left to an unbounded claim). An unbounded claim
// of the per-key policies finds the claimable heads key by key (sqlClaimKeys): its cost follows
// the keys and the batch, not the depth of the backlog.
//
// The claim runs in its own short transaction with bitmap and sequential scans disabled, sent
// as one pipelined batch (one round trip): without statistics (a freshly loaded table) the
// planner would otherwise sort every claimable row instead of walking the claim index in seq
// order and stopping at the limit. q must not be inside a transaction.
func (s *Store) claim(ctx context.Context, q batchSender, policy Policy, limit int, lease time.Duration,
	maxAttempts int, destinations []string, scanBudget int) (token envelope.UUID, out []claimedRow, err error) {
	return s.claimIn(ctx, q, policy, limit, lease, maxAttempts, destinations, scanBudget, shares.All, keyCursor{})
}

// keyCursor is a (source, key) where the per-key claim past the front (sqlClaimKeys) starts
// its walk of the keys: it looks at the keys after it only. The zero cursor starts at the first
// key. It changes only which keys a claim looks at first, never what a claim may take.
type keyCursor struct{ source, key string }

// lastKey is the cursor after the keys of rows: the last (source, key) in byte order (the
// order of the C collation; under another collation a later scan may look at a few keys
// again).
func lastKey(rows []claimedRow) keyCursor {
	var c keyCursor
	for _, r := range rows {
		if r.event.Key == nil {
			continue
		}
		if k := (keyCursor{r.event.Source, *r.event.Key}); k.source > c.source || k.source == c.source && k.key > c.key {
			c = k
		}
	}
	return c
}

// claimSQL is the claim statement of policy p.
func (s *Store) claimSQL(p Policy) string {
	switch p {
	case PerSourceStream:
		return s.q.ClaimSource
	case BestEffort:
		return s.q.ClaimAny
	}
	return s.q.ClaimKey
}

// claimIn is claim restricted to the rows of the claim shares in mask (internal/shares); with
// shares.All, or none, it claims from every share, exactly as claim. The scan budget counts the
// open rows of every share: a caller restricted to a fraction of the shares scales it. An
// unbounded per-key claim looks at the keys after from first (keyCursor).
func (s *Store) claimIn(ctx context.Context, q batchSender, policy Policy, limit int, lease time.Duration,
	maxAttempts int, destinations []string, scanBudget int, mask shares.Mask, from keyCursor) (token envelope.UUID, out []claimedRow, err error) {
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
	if budget == nil && !s.walkDeep && (policy == PerKeyHeadOfLine || policy == StopTheLine) {
		// Past the front of the backlog the heads are found by key, not by walking every
		// row behind them (sqlClaimKeys).
		b.Queue(s.q.ClaimKeys, [16]byte(token), maxAttempts, lease.Microseconds(), limit, dest, share, from.source, from.key)
	} else {
		b.Queue(s.claimSQL(policy), [16]byte(token), maxAttempts, lease.Microseconds(), limit, dest, budget, share)
	}
	b.Queue("COMMIT")
	br := q.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("claim outbox batch: %w", cerr)
			out = nil
		}
	}()
	if s.claimSent != nil {
		s.claimSent(q, token)
	}
	for range 3 {
		if _, err := br.Exec(); err != nil {
			return token, nil, fmt.Errorf("claim outbox batch: %w", err)
		}
	}
	out, err = s.readClaim(br)
	if err != nil {
		return token, nil, err
	}
	if _, err := br.Exec(); err != nil {
		return token, nil, fmt.Errorf("claim outbox batch: commit: %w", err)
	}
	return token, out, nil
}

// releaseLostClaim releases the rows still publishing under token, the token of a claim whose
// reply was lost, once its backend (pid) is gone (sqlReleaseLostClaim). alive reports that the
// backend still runs: nothing was released and the caller asks again later.
func (s *Store) releaseLostClaim(ctx context.Context, q batchSender, token envelope.UUID, pid uint32) (alive bool, released int64, err error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL enable_seqscan = off") // walk the open rows, not the retained ones
	b.Queue(s.q.ReleaseLost, [16]byte(token), int64(pid))
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

// batchSender sends a pipelined batch: *pgxpool.Pool and *pgx.Conn satisfy it.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// readClaim reads the claim statement's rows.
func (s *Store) readClaim(br pgx.BatchResults) ([]claimedRow, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	defer rows.Close()
	var out []claimedRow
	for rows.Next() {
		var (
			r                              claimedRow
			oldStatus, status              string
			id                             [16]byte
			key, registry, subject, fp     *string
			versionRef, schemaID, position *int64
			sourceEventID, causation, corr *[16]byte
			tp, ts, attrs                  *string
		)
		e := &r.event
		if err := rows.Scan(&oldStatus, &status, &r.seq, &r.attempt, &r.createdAt,
			&id, &e.Source, &e.MessageID, &e.Destination, &key, &e.EventType,
			&e.SchemaVersion, &e.ContentType, &registry, &subject, &versionRef, &schemaID, &fp,
			&sourceEventID, &position, &causation, &corr, &tp, &ts, &e.Payload, &attrs, &e.OccurredAt); err != nil {
			return nil, fmt.Errorf("claim outbox batch: %w", err)
		}
		r.id = id
		r.reclaimed = oldStatus == statusPublishing
		r.dead = status == statusDead
		fillEvent(e, key, registry, subject, fp, versionRef, schemaID, position, sourceEventID, causation, corr, tp, ts, attrs)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	return out, nil
}

// Row statuses.
const (
	statusPending    = "pending"
	statusPublishing = "publishing"
	statusSent       = "sent"
	statusFailed     = "failed"
	statusDead       = "dead"
	statusRejected   = "rejected"
)

// outcome is what the relay decided for one claimed row (markplan.Decide); its name is what
// sqlMark reads.
type outcome = markplan.Outcome

// The outcomes a mark writes.
const (
	outcomeSent     = markplan.Sent
	outcomeFailed   = markplan.Failed
	outcomeSkipped  = markplan.Skipped
	outcomeReleased = markplan.Released
	outcomeRejected = markplan.Rejected
	outcomeDeferred = markplan.Deferred
)

// mark is one row's outcome, ready to write.
type mark struct {
	id        envelope.UUID
	outcome   outcome
	err       string
	delay     time.Duration
	partition int32
	offset    int64
	code      string
	// dest is the row's destination, for per-destination metrics (not written).
	dest string
}

// markedRow is one row a mark statement moved: its id, the outcome asked for and the status it
// ended in (a failed outcome ends dead when the row had no attempt left).
type markedRow struct {
	id      envelope.UUID
	outcome string
	status  string
}

// destCounts are one destination's real transitions in a mark statement.
type destCounts struct{ sent, retried, dead, rejected int }

// transitions counts the rows a mark statement actually moved, by resulting state.
type transitions struct {
	sent, failed, dead, skipped, released, rejected, deferred int
	// byDest splits sent, retried (failed, deferred, skipped), dead and rejected per destination.
	byDest map[string]*destCounts
	rows   []markedRow // each row moved, for the transition log
}

func (t transitions) total() int {
	return t.sent + t.failed + t.dead + t.skipped + t.released + t.rejected + t.deferred
}

// markBatch writes a batch's outcomes in one statement (so one transaction), fenced by token.
// Rows no longer publishing under token are left untouched and not counted. On error the
// statement wrote nothing, whatever rows it returned before failing (a connection lost
// mid-result, an error at commit), and the transitions returned are empty.
func (s *Store) markBatch(ctx context.Context, q keiro.DB, token envelope.UUID, marks []mark, maxAttempts int) (transitions, error) {
	var t transitions
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
		ids[i] = m.id
		outs[i] = m.outcome.String()
		if m.err != "" {
			errs[i] = &marks[i].err
		}
		delays[i] = m.delay.Microseconds()
		parts[i], offs[i] = m.partition, m.offset
		if m.code != "" {
			codes[i] = &marks[i].code
		}
	}
	sql := s.q.Mark
	for _, m := range marks {
		if m.outcome == outcomeFailed || m.outcome == outcomeRejected {
			sql = s.q.MarkHistory // only a batch with a failure writes attempt histories
			break
		}
	}
	rows, err := q.Query(ctx, sql, [16]byte(token), ids, outs, errs, delays, parts, offs, codes, maxAttempts)
	if err != nil {
		return transitions{}, fmt.Errorf("mark outbox batch: %w", err)
	}
	defer rows.Close()
	dest := make(map[[16]byte]string, n)
	for _, m := range marks {
		dest[m.id] = m.dest
	}
	t.byDest = map[string]*destCounts{}
	for rows.Next() {
		var id [16]byte
		var out, status string
		if err := rows.Scan(&id, &out, &status); err != nil {
			return transitions{}, fmt.Errorf("mark outbox batch: %w", err)
		}
		t.add(markedRow{id: id, outcome: out, status: status}, dest[id])
	}
	if err := rows.Err(); err != nil {
		return transitions{}, fmt.Errorf("mark outbox batch: %w", err)
	}
	return t, nil
}

// add counts row, a row of destination dest that the mark moved.
func (t *transitions) add(row markedRow, dest string) {
	t.rows = append(t.rows, row)
	d := t.byDest[dest]
	if d == nil {
		d = &destCounts{}
		t.byDest[dest] = d
	}
	switch out := row.outcome; {
	case out == "sent":
		t.sent++
		d.sent++
	case out == "rejected":
		t.rejected++
		d.rejected++
	case out == "skipped":
		t.skipped++
		d.retried++
	case out == "released":
		t.released++
	case out == "deferred":
		t.deferred++
		d.retried++
	case row.status == statusDead:
		t.dead++
		d.dead++
	default:
		t.failed++
		d.retried++
	}
}

// renewLease extends the lease of the rows ids still publishing under token to lease from now,
// and returns how many it extended.
func (s *Store) renewLease(ctx context.Context, q keiro.DB, token envelope.UUID, ids [][16]byte, lease time.Duration) (int64, error) {
	tag, err := q.Exec(ctx, s.q.Renew, [16]byte(token), ids, lease.Microseconds())
	if err != nil {
		return 0, fmt.Errorf("renew outbox lease: %w", err)
	}
	return tag.RowsAffected(), nil
}

// startProduce records that the produce of rows ids, on their last attempt, starts: those
// still publishing under token get produce_started (sqlStartProduce). It returns the ids it
// recorded; the others were taken over by another relay.
func (s *Store) startProduce(ctx context.Context, q keiro.DB, token envelope.UUID, ids [][16]byte) (map[[16]byte]bool, error) {
	rows, err := q.Query(ctx, s.q.Start, [16]byte(token), ids)
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

var errNoRows = pgx.ErrNoRows
