// Package sleep is the relay's side of notify-on-sleep (the sleep locks of
// outbox/internal/sqlq): before the relay's first claimer sleeps it takes the schema's sleep
// lock on a session of its own, so producers start notifying, and claims once more with the
// lock held; it releases the lock when it wakes, so producers stop notifying while it works.
package sleep

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

// Sleeper holds a relay's sleep lock. One session per relay, opened when first needed and
// reopened after an error; without it the relay falls back to waiting for the poll interval
// (producers that do not notify then wait at most that long, as in poll-only mode). A Sleeper
// is used by one goroutine, the relay's first claimer.
type Sleeper struct {
	cfg         *pgx.ConnConfig
	lock, unlck string
	conn        *pgx.Conn
	held        bool
	// filtered: the relay publishes only some destinations (sleepLockFiltered).
	filtered bool
	// tries counts the failed tries since the lock was last taken or the relay last worked:
	// it spaces the next.
	tries int
	// failing is set while the session cannot be opened or used.
	failing bool
	// onLost is called when the session holding the lock dies while the relay sleeps (New).
	onLost func()
	// watchStop and watchDone end and await the watch of a held lock's session.
	watchStop context.CancelFunc
	watchDone chan struct{}
}

// New returns the sleeper of a relay that publishes every destination, or only some
// (filtered), whose session connects with cfg. onLost, if not nil, is called when the session
// holding the lock dies while the relay sleeps (a terminated backend, an idle-session timeout,
// a failover): the lock went with it, so producers stop notifying and the relay must wake to
// take it again.
func New(cfg *pgx.ConnConfig, q *sqlq.Queries, filtered bool, onLost func()) *Sleeper {
	if filtered {
		return &Sleeper{cfg: cfg, lock: q.SleepLockFiltered, unlck: q.SleepUnlockFiltered, filtered: true, onLost: onLost}
	}
	return &Sleeper{cfg: cfg, lock: q.SleepLock, unlck: q.SleepUnlock, onLost: onLost}
}

// RetryMax bounds the wait between two tries of the sleep lock while producers that did
// not notify are in their transactions (their rows will need a claim after they commit), and,
// for a relay restricted to some destinations, while another such relay sleeps under it.
const RetryMax = 50 * time.Millisecond

// RetryIn is how long to wait before the next try after one that found producers holding the
// lock, or that failed: 1 ms, doubling to RetryMax (never more than poll).
func (s *Sleeper) RetryIn(poll time.Duration) time.Duration {
	d := time.Millisecond << min(s.tries, 10)
	return min(d, RetryMax, poll)
}

// statementTimeout bounds connecting the sleep-lock session and each of its statements:
// on a dead connection (a failover, a dropped TCP flow) the first claimer must not hang; it
// closes the session and polls until a new one works.
const statementTimeout = 5 * time.Second

// Result is the outcome of one try of the sleep lock.
type Result int

const (
	Taken     Result = iota // the relay holds it and may sleep after one more claim
	Producers               // producers that did not notify are in their transactions
	Relay                   // another relay sleeps under it: producers notify
)

// Held reports whether the relay holds the lock.
func (s *Sleeper) Held() bool { return s.held }

// Filtered reports whether the relay publishes only some destinations: another relay
// sleeping under the lock then may not claim its rows.
func (s *Sleeper) Filtered() bool { return s.filtered }

// Failing reports whether the last try failed: the session could not be opened or used.
func (s *Sleeper) Failing() bool { return s.failing }

// Try takes the sleep lock without waiting, or says who holds it. A try that fails closes
// the session and spaces the next one (RetryIn).
func (s *Sleeper) Try(ctx context.Context) (Result, error) {
	got, err := s.try(ctx)
	s.failing = err != nil
	if err != nil {
		s.tries++
	}
	return got, err
}

func (s *Sleeper) try(ctx context.Context) (Result, error) {
	if s.held {
		return Taken, nil
	}
	ctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	if s.conn == nil {
		conn, err := pgx.ConnectConfig(ctx, s.cfg.Copy())
		if err != nil {
			return 0, fmt.Errorf("connect: %w", err)
		}
		s.conn = conn
	}
	var got string
	if err := s.conn.QueryRow(ctx, s.lock).Scan(&got); err != nil {
		s.Close()
		return 0, fmt.Errorf("take the sleep lock: %w", err)
	}
	switch got {
	case "taken":
		s.held, s.tries = true, 0
		s.watch()
		return Taken, nil
	case "producers":
		s.tries++
		return Producers, nil
	}
	if s.filtered {
		s.tries++
	} else {
		s.tries = 0
	}
	return Relay, nil
}

// watch reads the idle session of a held lock in the background: nothing arrives on it but
// the server's notice that the session ended, which calls onLost. Release and Close stop it
// before they use the session.
func (s *Sleeper) watch() {
	if s.onLost == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.watchStop, s.watchDone = cancel, done
	conn, lost := s.conn.PgConn(), s.onLost
	go func() {
		defer close(done)
		if err := conn.WaitForNotification(ctx); err != nil && ctx.Err() == nil {
			lost()
		}
	}()
}

// unwatch stops the watch of the session, if any, and waits for it to end.
func (s *Sleeper) unwatch() {
	if s.watchStop != nil {
		s.watchStop()
		<-s.watchDone
		s.watchStop, s.watchDone = nil, nil
	}
}

// Release gives the lock back, if held: the relay is working again, so its next failed try
// starts over at the shortest retry. On an error the session is closed, which releases it.
func (s *Sleeper) Release(ctx context.Context) error {
	s.tries = 0
	if !s.held {
		return nil
	}
	s.unwatch()
	s.held = false
	ctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	var ok bool
	err := s.conn.QueryRow(ctx, s.unlck).Scan(&ok)
	if err == nil && !ok {
		err = errors.New("the session did not hold it")
	}
	if err != nil {
		s.Close()
		return fmt.Errorf("release the sleep lock: %w", err)
	}
	return nil
}

// Close ends the session (releasing the lock with it).
func (s *Sleeper) Close() {
	s.unwatch()
	s.held = false
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.conn.Close(ctx)
		s.conn = nil
	}
}
