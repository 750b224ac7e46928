// Package translog writes the relay's transition log: every row a mark moves to failed
// (retried), dead or rejected, and every row that went dead in its claim, is logged with its
// outbox id, message id, key, destination and error: retried at warn, dead and rejected at
// error. Each kind has its own token bucket (Burst lines at once, then Rate per second) so
// that a storm (a topic deleted under a busy relay) cannot flood the log; lines over the
// budget are counted and the next line of that kind that is logged is preceded by a
// "suppressed N similar" line. The relay's counters and metrics still see every row.
package translog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

const (
	// Burst is the number of lines of one kind logged at once before the rate limit applies.
	Burst = 20
	// Rate is the number of lines per second of one kind, once the burst is spent.
	Rate = 1.0
)

// Kind is what a row's transition is logged as.
type Kind uint8

const (
	// Retried: the row failed and will be retried.
	Retried Kind = iota
	// Dead: the row has no attempt left.
	Dead
	// Rejected: Kafka refused the row for good.
	Rejected
	kinds
)

// String returns the kind's name, as the suppressed line reports it.
func (k Kind) String() string {
	return [...]string{"retried", "dead", "rejected"}[k]
}

// Row is one row's transition, as it is logged.
type Row struct {
	OutboxID, MessageID, Source, Destination string
	// Key is the row's key (nil: a null key, logged as "").
	Key     *string
	Attempt int
	// Code is the rejection code, if any.
	Code string
	// RetryIn is the backoff of a retried row (logged when positive).
	RetryIn time.Duration
	// Err is the row's error, or the reason of its transition.
	Err string
}

// Log rate-limits the transition lines of one relay. The zero value is ready to use.
type Log struct {
	mu         sync.Mutex
	now        func() time.Time // the clock; time.Now when nil (tests inject one)
	tokens     [kinds]float64
	last       [kinds]time.Time
	suppressed [kinds]int
	started    [kinds]bool
}

// allow takes a token of kind k. It returns whether the line may be logged and, when it may,
// how many lines of that kind were suppressed since the last one logged.
func (l *Log) allow(k Kind) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	t := now()
	if !l.started[k] {
		l.started[k], l.tokens[k], l.last[k] = true, Burst, t
	}
	l.tokens[k] = min(Burst, l.tokens[k]+t.Sub(l.last[k]).Seconds()*Rate)
	l.last[k] = t
	if l.tokens[k] < 1 {
		l.suppressed[k]++
		return false, 0
	}
	l.tokens[k]--
	suppressed, l.suppressed[k] = l.suppressed[k], 0
	return true, suppressed
}

// Write logs one row's transition to log if the kind's budget allows it.
func (l *Log) Write(ctx context.Context, log *slog.Logger, kind Kind, row Row) {
	ok, suppressed := l.allow(kind)
	if !ok {
		return
	}
	level, msg := slog.LevelWarn, "outbox row failed; it will be retried"
	switch kind {
	case Dead:
		level, msg = slog.LevelError, "outbox row is dead: no attempt left (see `relay dead list`)"
	case Rejected:
		level, msg = slog.LevelError, "outbox row rejected: it can never be published as it is (see `relay dead list`)"
	}
	if suppressed > 0 {
		log.Log(ctx, level, "outbox transitions suppressed by the log rate limit", "kind", kind.String(), "suppressed", suppressed)
	}
	key := slog.Attr{Key: "key", Value: slog.StringValue("")}
	if row.Key != nil {
		key.Value = slog.StringValue(*row.Key)
	}
	attrs := []slog.Attr{
		slog.String("outbox_id", row.OutboxID), slog.String("message_id", row.MessageID),
		slog.String("source", row.Source), key, slog.String("destination", row.Destination),
		slog.Int("attempt", row.Attempt),
	}
	if row.Code != "" {
		attrs = append(attrs, slog.String("code", row.Code))
	}
	if kind == Retried && row.RetryIn > 0 {
		attrs = append(attrs, slog.Duration("retry_in", row.RetryIn))
	}
	attrs = append(attrs, slog.String("err", row.Err))
	log.LogAttrs(ctx, level, msg, attrs...)
}
