package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

// Transition logging: every row a mark moves to failed (retried), dead or rejected, and every
// row that went dead in its claim, is logged with its outbox id, message id, key, destination
// and error: retried at warn, dead and rejected at error. Each kind has its own token bucket
// (transitionLogBurst lines at once, then transitionLogRate per second) so that a storm
// (a topic deleted under a busy relay) cannot flood the log; lines over the budget are counted
// and the next line of that kind that is logged is preceded by a "suppressed N similar" line.
// The counters and metrics still see every row.
const (
	transitionLogBurst = 20
	transitionLogRate  = 1.0 // lines per second per kind, once the burst is spent
)

// markedRow is one row a mark statement moved: its id, the outcome asked for and the status it
// ended in (a failed outcome ends dead when the row had no attempt left).
type markedRow struct {
	id      envelope.UUID
	outcome string
	status  string
}

// transitionKind is what a row's transition is logged as.
type transitionKind uint8

const (
	transitionRetried transitionKind = iota
	transitionDead
	transitionRejected
	transitionKinds
)

func (k transitionKind) String() string {
	return [...]string{"retried", "dead", "rejected"}[k]
}

// transitionLog rate-limits the transition lines of one relay. The zero value is ready to use.
type transitionLog struct {
	mu         sync.Mutex
	now        func() time.Time // the clock; time.Now when nil (tests inject one)
	tokens     [transitionKinds]float64
	last       [transitionKinds]time.Time
	suppressed [transitionKinds]int
	started    [transitionKinds]bool
}

// allow takes a token of kind k. It returns whether the line may be logged and, when it may,
// how many lines of that kind were suppressed since the last one logged.
func (l *transitionLog) allow(k transitionKind) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	t := now()
	if !l.started[k] {
		l.started[k], l.tokens[k], l.last[k] = true, transitionLogBurst, t
	}
	l.tokens[k] = min(transitionLogBurst, l.tokens[k]+t.Sub(l.last[k]).Seconds()*transitionLogRate)
	l.last[k] = t
	if l.tokens[k] < 1 {
		l.suppressed[k]++
		return false, 0
	}
	l.tokens[k]--
	suppressed, l.suppressed[k] = l.suppressed[k], 0
	return true, suppressed
}

// logTransitions logs the rows of batch b that marks moved to failed, dead or rejected (moved
// as the mark statement reports them), and the rows that went dead in the claim.
func (r *Relay) logTransitions(ctx context.Context, b *batch, marks []mark, moved []markedRow) {
	rows := make(map[envelope.UUID]*claimedRow, len(b.rows))
	for i := range b.rows {
		rows[b.rows[i].id] = &b.rows[i]
		if b.rows[i].dead {
			r.logTransition(ctx, transitionDead, &b.rows[i], nil, "lease expired after the last attempt: the outcome of that attempt is unknown")
		}
	}
	byID := make(map[envelope.UUID]*mark, len(marks))
	for i := range marks {
		byID[marks[i].id] = &marks[i]
	}
	for _, mr := range moved {
		var kind transitionKind
		switch {
		case mr.outcome == outcomeRejected.String():
			kind = transitionRejected
		case mr.status == statusDead:
			kind = transitionDead
		case mr.outcome == outcomeFailed.String():
			kind = transitionRetried
		default:
			continue // sent, released, skipped or deferred (a Kafka outage is logged once per batch)
		}
		row := rows[mr.id]
		if row == nil {
			continue
		}
		r.logTransition(ctx, kind, row, byID[mr.id], "")
	}
}

// logTransition logs one row's transition if the kind's budget allows it.
func (r *Relay) logTransition(ctx context.Context, kind transitionKind, row *claimedRow, m *mark, reason string) {
	ok, suppressed := r.transitionLog.allow(kind)
	if !ok {
		return
	}
	level, msg := slog.LevelWarn, "outbox row failed; it will be retried"
	switch kind {
	case transitionDead:
		level, msg = slog.LevelError, "outbox row is dead: no attempt left (see `relay dead list`)"
	case transitionRejected:
		level, msg = slog.LevelError, "outbox row rejected: it can never be published as it is (see `relay dead list`)"
	}
	if suppressed > 0 {
		r.log.Log(ctx, level, "outbox transitions suppressed by the log rate limit", "kind", kind.String(), "suppressed", suppressed)
	}
	key := slog.Attr{Key: "key", Value: slog.StringValue("")}
	if row.event.Key != nil {
		key.Value = slog.StringValue(*row.event.Key)
	}
	attrs := []slog.Attr{
		slog.String("outbox_id", row.id.String()), slog.String("message_id", row.event.MessageID),
		slog.String("source", row.event.Source), key, slog.String("destination", row.event.Destination),
		slog.Int("attempt", row.attempt),
	}
	if m != nil {
		if m.code != "" {
			attrs = append(attrs, slog.String("code", m.code))
		}
		if kind == transitionRetried && m.delay > 0 {
			attrs = append(attrs, slog.Duration("retry_in", m.delay))
		}
		reason = m.err
	}
	attrs = append(attrs, slog.String("err", reason))
	r.log.LogAttrs(ctx, level, msg, attrs...)
}
