package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

// sleeper is the relay's side of notify-on-sleep (see sleepLockAll in internal/sqlq): before the first
// claimer sleeps it takes the schema's sleep lock on a session of its own, so producers start
// notifying, and claims once more with the lock held; it releases the lock when it wakes, so
// producers stop notifying while it works. One session per relay, opened when first needed and
// reopened after an error; without it the relay falls back to waiting for the poll interval
// (producers that do not notify then wait at most that long, as in poll-only mode).
type sleeper struct {
	cfg         *pgx.ConnConfig
	lock, unlck string
	conn        *pgx.Conn
	held        bool
	// filtered: the relay publishes only some destinations (sleepLockFiltered).
	filtered bool
	// tries counts the failed tries since the lock was last taken or the relay last worked:
	// it spaces the next.
	tries int
	// failing is set while the session cannot be opened or used (logged once).
	failing bool
	// onLost is called when the session holding the lock dies while the relay sleeps (a
	// terminated backend, an idle-session timeout, a failover): the lock went with it, so
	// producers stop notifying and the relay must wake to take it again.
	onLost func()
	// watchStop and watchDone end and await the watch of a held lock's session.
	watchStop context.CancelFunc
	watchDone chan struct{}
}

// newSleeper returns the sleeper of a relay that publishes every destination, or only some
// (filtered), whose session connects with cfg.
func newSleeper(cfg *pgx.ConnConfig, q *sqlq.Queries, filtered bool) *sleeper {
	if filtered {
		return &sleeper{cfg: cfg, lock: q.SleepLockFiltered, unlck: q.SleepUnlockFiltered, filtered: true}
	}
	return &sleeper{cfg: cfg, lock: q.SleepLock, unlck: q.SleepUnlock}
}

// sleepRetryMax bounds the wait between two tries of the sleep lock while producers that did
// not notify are in their transactions (their rows will need a claim after they commit), and,
// for a relay restricted to some destinations, while another such relay sleeps under it.
const sleepRetryMax = 50 * time.Millisecond

// retryIn is how long to wait before the next try after one that found producers holding the
// lock: 1 ms, doubling to sleepRetryMax (never more than poll).
func (s *sleeper) retryIn(poll time.Duration) time.Duration {
	d := time.Millisecond << min(s.tries, 10)
	return min(d, sleepRetryMax, poll)
}

// sleepStatementTimeout bounds connecting the sleep-lock session and each of its statements:
// on a dead connection (a failover, a dropped TCP flow) the first claimer must not hang; it
// closes the session and polls until a new one works.
const sleepStatementTimeout = 5 * time.Second

// tryResult is the outcome of one try of the sleep lock.
type tryResult int

const (
	tryTaken     tryResult = iota // the relay holds it and may sleep after one more claim
	tryProducers                  // producers that did not notify are in their transactions
	tryRelay                      // another relay sleeps under it: producers notify
)

// try takes the sleep lock without waiting, or says who holds it.
func (s *sleeper) try(ctx context.Context) (tryResult, error) {
	if s.held {
		return tryTaken, nil
	}
	ctx, cancel := context.WithTimeout(ctx, sleepStatementTimeout)
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
		s.close()
		return 0, fmt.Errorf("take the sleep lock: %w", err)
	}
	switch got {
	case "taken":
		s.held, s.tries = true, 0
		s.watch()
		return tryTaken, nil
	case "producers":
		s.tries++
		return tryProducers, nil
	}
	if s.filtered {
		s.tries++
	} else {
		s.tries = 0
	}
	return tryRelay, nil
}

// watch reads the idle session of a held lock in the background: nothing arrives on it but
// the server's notice that the session ended, which calls onLost. release and close stop it
// before they use the session.
func (s *sleeper) watch() {
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
func (s *sleeper) unwatch() {
	if s.watchStop != nil {
		s.watchStop()
		<-s.watchDone
		s.watchStop, s.watchDone = nil, nil
	}
}

// release gives the lock back, if held. On an error the session is closed, which releases it.
func (s *sleeper) release(ctx context.Context) error {
	if !s.held {
		return nil
	}
	s.unwatch()
	s.held = false
	ctx, cancel := context.WithTimeout(ctx, sleepStatementTimeout)
	defer cancel()
	var ok bool
	err := s.conn.QueryRow(ctx, s.unlck).Scan(&ok)
	if err == nil && !ok {
		err = errors.New("the session did not hold it")
	}
	if err != nil {
		s.close()
		return fmt.Errorf("release the sleep lock: %w", err)
	}
	return nil
}

// close ends the session (releasing the lock with it).
func (s *sleeper) close() {
	s.unwatch()
	s.held = false
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.conn.Close(ctx)
		s.conn = nil
	}
}
