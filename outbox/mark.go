package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/backoff"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/internal/markplan"
	"github.com/keiro-go/keiro/outbox/internal/publish"
	"github.com/keiro-go/keiro/outbox/internal/translog"
)

// markOutcome decides the outcome of a batch's rows from their produce results (plan), writes
// them in one statement (writeMarks), and reports the transitions the write made: in the
// batch's result, the relay's stats, its metrics and its logs.
func (r *engine) markOutcome(ctx context.Context, b *claimedBatch) BatchResult {
	b.mu.Lock()
	results := append([]produceResult(nil), b.results...)
	b.closed, b.marking = true, true
	b.mu.Unlock()

	p := r.plan(b, results)
	for i, suspect := range p.Suspects {
		if suspect {
			r.suspects.Add(b.rows[i].ID)
		} else {
			r.suspects.Remove(b.rows[i].ID)
		}
	}
	for _, i := range p.OrderBroken {
		row, pr := &b.rows[i], &results[i]
		r.log.ErrorContext(ctx, "a record reached Kafka after an earlier record of its key failed: the key is out of order on the topic",
			"outbox_id", row.ID.String(), "message_id", row.Event.MessageID, "destination", row.Event.Destination,
			"partition", pr.partition, "offset", pr.offset)
	}
	if n := len(p.OrderBroken); n > 0 {
		r.inst.OrderBroken.Add(ctx, int64(n))
		r.stats.orderBroken.Add(int64(n))
	}
	if p.Sent {
		r.outageStreak.Store(0)
	}
	if p.Outage {
		d := r.cfg.Backoff.Delay(int(r.outageStreak.Add(1)))
		p.DeferFor(d)
		r.log.WarnContext(ctx, "Kafka unavailable; rows deferred without using an attempt", "retry_in", d)
	}
	// Rows going back to failed are due after their delay: wake the claim loop then, rather
	// than leave them to the next poll.
	if d := p.RetryIn(); d > 0 {
		defer time.AfterFunc(d, r.signal)
	}
	marks := make([]claimsql.Mark, len(p.Marks))
	for j, m := range p.Marks {
		row := &b.rows[m.Row]
		marks[j] = claimsql.Mark{ID: row.ID, Outcome: m.Outcome, Err: m.Err, Delay: m.Delay, Partition: m.Partition,
			Offset: m.Offset, Code: m.Code, Dest: row.Event.Destination}
	}

	t, landed := r.writeMarks(ctx, b, marks)
	b.mu.Lock()
	b.markLanded = landed
	b.mu.Unlock()
	r.logTransitions(ctx, b, marks, t.Rows)
	res := BatchResult{Claimed: len(b.rows), Reclaimed: p.Reclaimed, OrderBroken: len(p.OrderBroken),
		Published: t.Sent, Retried: t.Failed + t.Deferred, Skipped: t.Skipped, Dead: t.Dead + len(p.Dead),
		Rejected: t.Rejected, Released: t.Released}
	if p.HaltedOn >= 0 {
		id := b.rows[p.HaltedOn].ID.String()
		res.HaltedOn = &id
	}
	deadOnClaim := map[string]int{}
	for _, i := range p.Dead {
		deadOnClaim[b.rows[i].Event.Destination]++
	}
	r.record(ctx, b, t, deadOnClaim)
	s := &r.stats
	s.batches.Add(1)
	s.published.Add(int64(t.Sent))
	s.retried.Add(int64(t.Failed))
	s.deferred.Add(int64(t.Deferred))
	s.skipped.Add(int64(t.Skipped))
	s.dead.Add(int64(res.Dead))
	s.rejected.Add(int64(t.Rejected))
	s.released.Add(int64(t.Released))
	s.reclaimed.Add(int64(res.Reclaimed))
	if r.cfg.OnBatch != nil {
		r.cfg.OnBatch(res)
	}
	return res
}

// plan decides the outcome of batch b's rows from their produce results (markplan.Decide),
// under the relay's ordering policy and retry backoff.
func (r *engine) plan(b *claimedBatch, results []produceResult) markplan.Plan {
	rows := make([]markplan.Row, len(b.rows))
	res := make([]markplan.Result, len(b.rows))
	for i := range b.rows {
		row, pr := &b.rows[i], &results[i]
		rows[i] = markplan.Row{Group: groupKey(r.cfg.Policy, &row.Event), Key: groupKey(PerKeyHeadOfLine, &row.Event),
			Attempt: row.Attempt, Reclaimed: row.Reclaimed, Dead: row.Dead}
		res[i] = markplan.Result{Done: pr.done, Err: pr.err, Partition: pr.partition, Offset: pr.offset,
			RejectCode: pr.rejectCode, RejectMsg: pr.rejectMsg, Shared: pr.shared, LeaseLost: pr.leaseLost}
	}
	return markplan.Decide(rows, res, r.cfg.Policy == StopTheLine, r.cfg.Backoff.Delay)
}

// writeMarks writes batch b's marks in one statement, fenced by its claim token, retrying
// while PostgreSQL is unreachable, and returns the transitions of the mark that committed, if
// one did, and whether one did (landed). A mark that failed wrote nothing, even when its
// statement had returned rows before the failure (a connection lost mid-result, an error at
// commit): its batch counts, logs and reports no transition, and its rows are left to the
// retry or to their lease.
func (r *engine) writeMarks(ctx context.Context, b *claimedBatch, marks []claimsql.Mark) (claimsql.Transitions, bool) {
	t0 := time.Now()
	refused := 0
	for attempt := 1; ; attempt++ {
		// Each attempt gets its own deadline, so the marks of a shutdown still get one try
		// after the hard deadline passed.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if r.markHook != nil {
			r.markHook()
		}
		t, err := r.claims.MarkBatch(actx, r.pool, b.token, marks, r.cfg.MaxAttempts)
		cancel()
		if err == nil {
			r.log.DebugContext(ctx, "marked", "rows", len(marks), "moved", t.Total(), "took", time.Since(t0))
			return t, true
		}
		r.stats.markErrors.Add(1)
		if ctx.Err() != nil {
			r.log.ErrorContext(ctx, "marking outbox batch abandoned at shutdown; rows will be re-claimed after their lease", "err", err)
			return claimsql.Transitions{}, false
		}
		// A mark PostgreSQL refuses (the statement itself cannot succeed) is retried a few
		// times: retried forever, its lease renewed meanwhile, it would pin its rows and their
		// keys. An unreachable or recovering database is retried for as long as it takes: the
		// rows are safe under their renewed lease meanwhile.
		if isRefusal(err) {
			refused++
		} else {
			refused = 0
		}
		if refused >= maxMarkRefusals {
			r.stats.marksAbandoned.Add(1)
			r.log.ErrorContext(ctx, "PostgreSQL keeps refusing the mark of an outbox batch; giving up: its rows are re-claimed once their lease expires",
				"err", err, "refusals", refused, "rows", len(marks), "lease", r.cfg.Lease)
			return claimsql.Transitions{}, false
		}
		d := markRetryBackoff.Delay(attempt)
		r.log.WarnContext(ctx, "mark failed; retrying", "err", err, "retry_in", d)
		if backoff.Sleep(ctx, d) != nil {
			return claimsql.Transitions{}, false
		}
	}
}

// record adds a batch's real transitions to the metrics, per destination.
func (r *engine) record(ctx context.Context, b *claimedBatch, t claimsql.Transitions, deadOnClaim map[string]int) {
	for dest, c := range t.ByDest {
		attrs := publish.DestinationAttr(dest)
		if c.Sent > 0 {
			r.pub.AddPublished(ctx, int64(c.Sent), dest)
		}
		if c.Retried > 0 {
			r.inst.Retried.Add(ctx, int64(c.Retried), attrs)
		}
		if c.Rejected > 0 {
			r.inst.Rejected.Add(ctx, int64(c.Rejected), attrs)
		}
		if c.Dead > 0 {
			r.inst.Deadlettered.Add(ctx, int64(c.Dead), attrs)
		}
	}
	for dest, n := range deadOnClaim {
		r.inst.Deadlettered.Add(ctx, int64(n), publish.DestinationAttr(dest))
	}
	if n := countReclaimed(b); n > 0 {
		r.inst.Reclaimed.Add(ctx, int64(n))
	}
}

func countReclaimed(b *claimedBatch) int {
	n := 0
	for i := range b.rows {
		if b.rows[i].Reclaimed {
			n++
		}
	}
	return n
}

// maxMarkRefusals is how many times in a row PostgreSQL may refuse a batch's mark before the
// relay gives the batch up to its lease.
const maxMarkRefusals = 5

// markRetryBackoff spaces the retries of a batch's mark that PostgreSQL failed: short at first,
// so a blip costs little, and at most 5s apart during an outage.
var markRetryBackoff = keiro.Backoff{Initial: 50 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}

// isRefusal reports an error PostgreSQL answered about the statement itself (bad data, a
// constraint, a trigger's exception), as opposed to a lost connection, a timeout, or a state of
// the server that passes: connection exceptions (08), deadlocks and serialization failures (40),
// insufficient resources (53), lock timeouts (55), shutdowns and recoveries (57), system errors
// (58).
func isRefusal(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) < 2 {
		return false
	}
	switch pe.Code[:2] {
	case "08", "40", "53", "55", "57", "58":
		return false
	}
	return true
}

// logTransitions logs the rows of batch b that marks moved to failed, dead or rejected (moved
// as the mark statement reports them), and the rows that went dead in the claim (the transition
// log, internal/translog).
func (r *engine) logTransitions(ctx context.Context, b *claimedBatch, marks []claimsql.Mark, moved []claimsql.MarkedRow) {
	rows := make(map[envelope.UUID]*claimsql.Row, len(b.rows))
	for i := range b.rows {
		rows[b.rows[i].ID] = &b.rows[i]
		if b.rows[i].Dead {
			r.logTransition(ctx, translog.Dead, &b.rows[i], nil, "lease expired after the last attempt: the outcome of that attempt is unknown")
		}
	}
	byID := make(map[envelope.UUID]*claimsql.Mark, len(marks))
	for i := range marks {
		byID[marks[i].ID] = &marks[i]
	}
	for _, mr := range moved {
		var kind translog.Kind
		switch {
		case mr.Outcome == outcomeRejected.String():
			kind = translog.Rejected
		case mr.Status == string(StatusDead):
			kind = translog.Dead
		case mr.Outcome == outcomeFailed.String():
			kind = translog.Retried
		default:
			continue // sent, released, skipped or deferred (a Kafka outage is logged once per batch)
		}
		row := rows[mr.ID]
		if row == nil {
			continue
		}
		r.logTransition(ctx, kind, row, byID[mr.ID], "")
	}
}

// logTransition logs one row's transition, with m's error (reason without a mark), if the
// kind's budget allows it.
func (r *engine) logTransition(ctx context.Context, kind translog.Kind, row *claimsql.Row, m *claimsql.Mark, reason string) {
	lr := translog.Row{OutboxID: row.ID.String(), MessageID: row.Event.MessageID, Source: row.Event.Source,
		Destination: row.Event.Destination, Key: row.Event.Key, Attempt: row.Attempt, Err: reason}
	if m != nil {
		lr.Code, lr.RetryIn, lr.Err = m.Code, m.Delay, m.Err
	}
	r.transitionLog.Write(ctx, r.log, kind, lr)
}

// The outcomes a mark writes.
const (
	outcomeSent     = markplan.Sent
	outcomeFailed   = markplan.Failed
	outcomeSkipped  = markplan.Skipped
	outcomeReleased = markplan.Released
	outcomeRejected = markplan.Rejected
	outcomeDeferred = markplan.Deferred
)
