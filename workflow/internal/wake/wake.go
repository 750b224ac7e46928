// Package wake is the push path of the workflow worker (keiro's Keiro.Wake): a listener that
// blocks until a NOTIFY arrives on a channel or a fallback timeout elapses, whichever is
// first. A notification is an opaque "go look"; correctness never depends on one arriving.
package wake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Reason is why Wait returned (keiro's WakeReason).
type Reason uint8

const (
	// ByTimeout means the fallback timeout elapsed without a notification.
	ByTimeout Reason = iota
	// ByNotify means a notification arrived.
	ByNotify
)

// String returns "timeout" or "notify".
func (r Reason) String() string {
	if r == ByNotify {
		return "notify"
	}
	return "timeout"
}

// Listener holds one pooled connection that LISTENs on a channel.
type Listener struct {
	conn    *pgxpool.Conn
	channel string
}

// Listen acquires a connection from pool and LISTENs on channel (a validated identifier).
func Listen(ctx context.Context, pool *pgxpool.Pool, channel string) (*Listener, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("listen for workflow wakes: %w", err)
	}
	if _, err := conn.Exec(ctx, `LISTEN "`+channel+`"`); err != nil {
		conn.Release()
		return nil, fmt.Errorf("listen for workflow wakes on %s: %w", channel, err)
	}
	return &Listener{conn: conn, channel: channel}, nil
}

// Wait blocks until a notification arrives (ByNotify) or timeout elapses (ByTimeout). Several
// notifications queued meanwhile are drained as one. An error means the connection failed:
// Close the listener and open another.
func (l *Listener) Wait(ctx context.Context, timeout time.Duration) (Reason, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := l.conn.Conn().WaitForNotification(wctx)
	switch {
	case err == nil:
		l.drain(ctx)
		return ByNotify, nil
	case ctx.Err() != nil:
		return ByTimeout, ctx.Err()
	case errors.Is(err, context.DeadlineExceeded) || wctx.Err() != nil:
		return ByTimeout, nil
	}
	return ByTimeout, fmt.Errorf("wait for workflow wakes: %w", err)
}

// drain drops the notifications already queued, so a burst wakes one pass: pgx returns queued
// ones before it looks at the context, and a done context reads nothing from the connection.
func (l *Listener) drain(ctx context.Context) {
	done, stop := context.WithCancel(ctx)
	stop()
	for {
		if _, err := l.conn.Conn().WaitForNotification(done); err != nil {
			return
		}
	}
}

// Close stops listening and gives the connection back, or destroys it when UNLISTEN fails (a
// session that may still listen never returns to the pool).
func (l *Listener) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(ctx, `UNLISTEN *`); err != nil {
		_ = l.conn.Conn().Close(ctx)
	}
	l.conn.Release()
}
