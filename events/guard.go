package events

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// guard is the late-commit guard of one Run: the fences it took over appends to the store that
// were open, and the newest position proven final. Every form of subscription (one checkpoint,
// or one per bucket) reads the log only up to the position its guard returns, so none skips an
// event committed late with a lower position. See docs/architecture.md, "Event store".
type guard struct {
	fences []fence // pending, oldest first
	fenced int64   // newest head fenced so far
	final  int64   // newest position proven final
	retry  time.Duration
}

// fence records that every position ≤ head was drawn by a transaction that had ended when
// the fence was taken or is one of writers (the store's writers then, by virtual transaction
// id). Once none of writers runs, positions ≤ head are final: reading them can no longer miss
// a late commit. See docs/architecture.md for the proof.
type fence struct {
	head    int64
	writers []string
}

// pending returns the writers of the pending fences (never nil), for the horizon query to
// report which of them still run.
func (g *guard) pending() []string {
	out := []string{}
	for _, f := range g.fences {
		out = append(out, f.writers...)
	}
	return out
}

// advance returns the highest position known final (-1 if none yet), given which pending
// writers still run (from the horizon query) and the log's head. It takes a new fence on conn
// (statement fenceSQL) when the log has grown past both the newest fence and floor, the lowest
// position the caller still has to read past.
func (g *guard) advance(ctx context.Context, conn *pgx.Conn, fenceSQL string, still []string, head, floor int64) (int64, error) {
	running := make(map[string]bool, len(still))
	for _, v := range still {
		running[v] = true
	}
	safe := max(g.final, g.ripen(running))
	if head > g.fenced && head > floor && len(g.fences) < maxFences {
		var f fence
		if err := conn.QueryRow(ctx, fenceSQL).Scan(&f.head, &f.writers); err != nil {
			return 0, fmt.Errorf("take fence: %w", err)
		}
		g.fenced = f.head
		if len(f.writers) == 0 {
			// Most often no append is open: the fence is final at once.
			safe = max(safe, f.head)
		} else {
			g.fences = append(g.fences, f)
		}
	}
	g.final = safe
	return safe, nil
}

// ripen drops the fences none of whose writers is running and returns the newest such head.
func (g *guard) ripen(running map[string]bool) int64 {
	safe := int64(-1)
	keep := g.fences[:0]
	for _, f := range g.fences {
		if !slices.ContainsFunc(f.writers, func(v string) bool { return running[v] }) {
			safe = max(safe, f.head)
		} else {
			keep = append(keep, f)
		}
	}
	g.fences = keep
	return safe
}

// wait returns how long to wait for a notification: the poll interval, or less while fences
// are pending (events are committed but not yet final: appends that may hold lower positions
// are still open, so look again soon rather than at the next poll).
func (g *guard) wait(poll time.Duration) time.Duration {
	if len(g.fences) == 0 {
		g.retry = 0
		return poll
	}
	g.retry = min(max(2*g.retry, minFenceRetry), poll)
	return g.retry
}

// waitNotification blocks on conn until a notification, d, or ctx's end, and returns the
// payloads of the notifications it took (none on a timeout). Notifications that arrived while
// the session was busy are queued by pgx and returned at once; they are all drained, since one
// pass reads everything committed so far. With listen false it only waits.
func waitNotification(ctx context.Context, conn *pgx.Conn, d time.Duration, listen bool) ([]string, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if !listen {
		<-wctx.Done()
		return nil, nil
	}
	n, err := conn.WaitForNotification(wctx)
	if err != nil {
		if wctx.Err() == nil {
			return nil, fmt.Errorf("wait for notification: %w", err)
		}
		return nil, nil
	}
	payloads := []string{n.Payload}
	// Drop the notifications queued behind this one (one per appending transaction), or each
	// would buy one more empty pass. pgx returns queued ones before it looks at the context,
	// and a done context reads nothing from the connection.
	done, stop := context.WithCancel(ctx)
	stop()
	for {
		n, err := conn.WaitForNotification(done)
		if err != nil {
			break
		}
		payloads = append(payloads, n.Payload)
	}
	return payloads, nil
}
