package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// sleeper is the relay's side of notify-on-sleep (see sleepLock in sql.go): before the first
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
	// tries counts the failed tries since the lock was last taken or the relay last worked:
	// it spaces the next.
	tries int
	// failing is set while the session cannot be opened or used (logged once).
	failing bool
}

// sleepRetryMax bounds the wait between two tries of the sleep lock. A try fails while a
// producer that did not notify is still in its transaction (its row will need a claim after it
// commits), and while another relay sleeps (producers then notify, and this relay hears them):
// the first is short in practice and the second costs one cheap claim per wait.
const sleepRetryMax = 50 * time.Millisecond

// retryIn is how long to wait before the next try after a failed one: 1 ms, doubling to
// sleepRetryMax (never more than poll).
func (s *sleeper) retryIn(poll time.Duration) time.Duration {
	d := time.Millisecond << min(s.tries, 10)
	return min(d, sleepRetryMax, poll)
}

// try takes the sleep lock without waiting and reports whether it did.
func (s *sleeper) try(ctx context.Context) (bool, error) {
	if s.held {
		return true, nil
	}
	if s.conn == nil {
		conn, err := pgx.ConnectConfig(ctx, s.cfg.Copy())
		if err != nil {
			return false, fmt.Errorf("connect: %w", err)
		}
		s.conn = conn
	}
	var ok bool
	if err := s.conn.QueryRow(ctx, s.lock).Scan(&ok); err != nil {
		s.close()
		return false, fmt.Errorf("take the sleep lock: %w", err)
	}
	s.held = ok
	if ok {
		s.tries = 0
	} else {
		s.tries++
	}
	return ok, nil
}

// release gives the lock back, if held. On an error the session is closed, which releases it.
func (s *sleeper) release(ctx context.Context) error {
	if !s.held {
		return nil
	}
	s.held = false
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
	s.held = false
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.conn.Close(ctx)
		s.conn = nil
	}
}
