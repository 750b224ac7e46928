// Package shares splits an outbox's backlog between the relays on it: claim shares.
//
// The rows of an outbox fall into Count shares by a hash computed in the claim itself (no
// column: ShareOfKey, shareOfSource and shareOfSeq in outbox/internal/sqlq): under the per-key
// policies a key's rows are all in one share. The relays that publish the same destinations
// form a share group; each holds the group's member lock shared and some of its share locks
// exclusively, on a session of its own (the lock keys are internal/advisorylock's), and aims at
// ceil(Count / members) shares: at every balance step (every poll interval, at most a second)
// it counts the members, releases the shares over its aim and tries free ones up to it. A relay
// that stops, dies or loses its session loses its locks with it, so the others take its shares
// at their next step.
//
// Shares are a preference, not a fence. While the backlog is deep (its last claim came back
// full) a relay claims from its own shares first, so two relays no longer lock, look up and
// drop the same rows; when such a claim comes back empty it claims at once from every share
// (orphaned shares, a dead relay's rows before the rebalance, the tail of a drain) and does so
// until the next poll interval. In a trickle, and for a relay that holds every share (the only
// one of its group) or none (no session), the claim is unrestricted: exactly the claim of a
// relay without shares. Head-of-line, FOR UPDATE SKIP LOCKED, claim tokens and leases are
// unchanged, and they alone make a claim correct: a share moving between relays, two relays
// briefly holding the same share's rows, or a relay claiming another's share, never breaks a
// key's order or a lease.
//
// Relays of different groups (other destination filters) never partition each other's rows: a
// row in a share held by a relay that does not publish its destination would wait for the
// others' fallback. PollOnly relays take no shares (a session lock does not survive PgBouncer's
// transaction mode) and claim unrestricted.
package shares

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

// Count is the number of claim shares of a group: enough that relays split them evenly
// (1 to 8 relays get equal or nearly equal parts) and few enough for a bit set in one bigint.
// The share SQL (outbox/internal/sqlq) spells it as 64 and 63.
const Count = 64

// Mask is a set of claim shares: bit i is share i.
type Mask uint64

// All is every share: an unrestricted claim.
const All = ^Mask(0)

// Count is the number of shares in m.
func (m Mask) Count() int { return bits.OnesCount64(uint64(m)) }

// group is the share group of relays restricted to destinations: "" for every destination,
// else the distinct destinations in order, joined by "," (topic names have no comma).
func group(destinations []string) string {
	d := slices.Clone(destinations)
	slices.Sort(d)
	return strings.Join(slices.Compact(d), ",")
}

// BalanceInterval bounds the time between two balance steps (the poll interval, if
// shorter): how long a dead relay's shares stay orphaned, and a new relay waits for its part.
const BalanceInterval = time.Second

// statementTimeout bounds connecting the share session and each of its statements, as the
// sleep lock's (outbox/internal/sleep): on a dead connection a balance step must not hang.
const statementTimeout = 5 * time.Second

// Set is one relay's membership of its share group and the shares it holds, on a session of
// its own, opened at the first balance step and reopened after an error. Only the balance
// loop (Run) uses the session; claimers read Shares.
type Set struct {
	cfg   *pgx.ConnConfig
	q     *sqlq.Queries
	group string
	conn  *pgx.Conn
	// held are the shares held, in the order taken; the last taken are released first.
	held []int32
	// from is where this relay starts looking for free shares, so relays joining together
	// try different shares first.
	from int32
	// mask is held as a Mask (0 while no session holds any); members, the group's size
	// at the last step.
	mask, members atomic.Int64
	// pid is the share session's backend (0 while there is none), for diagnostics.
	pid atomic.Uint32
}

// New returns the share set of a relay restricted to destinations (none: every destination),
// whose session connects with cfg.
func New(cfg *pgx.ConnConfig, q *sqlq.Queries, destinations []string) *Set {
	return &Set{cfg: cfg, q: q, group: group(destinations), from: rand.Int32N(Count)}
}

// Shares returns the shares held now (0: none, the claim is unrestricted).
func (s *Set) Shares() Mask { return Mask(s.mask.Load()) }

// Members returns the size of the relay's share group at the last balance step (0 while the
// relay is not a member).
func (s *Set) Members() int64 { return s.members.Load() }

// PID returns the backend process id of the share session (0 while there is none).
func (s *Set) PID() uint32 { return s.pid.Load() }

// Run runs balance steps every interval until ctx ends, then closes the share session, so the
// other relays take its shares at their next step. before, if not nil, runs before each step.
// A step that fails is logged once, at warn, until one succeeds again.
func (s *Set) Run(ctx context.Context, every time.Duration, log *slog.Logger, before func(context.Context)) {
	defer s.Close()
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		if before != nil {
			before(ctx)
		}
		if err := s.Balance(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				failing = true
				log.WarnContext(ctx, "claim shares unavailable; claiming from every share until they are back", "err", err)
			}
		} else if failing {
			failing = false
			log.InfoContext(ctx, "claim shares available again")
		}
		log.DebugContext(ctx, "claim shares balanced", "held", s.Shares().Count(), "members", s.Members())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Balance runs one balance step: it joins the group if it is not a member, counts the
// members, and releases the shares over its aim or tries free ones up to it. On an error the
// session is closed, which releases every lock it held, and the relay holds no share until a
// later step succeeds.
func (s *Set) Balance(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	err := s.step(ctx)
	if err != nil {
		s.Close()
	}
	return err
}

func (s *Set) step(ctx context.Context) error {
	if s.conn == nil {
		conn, err := pgx.ConnectConfig(ctx, s.cfg.Copy())
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		s.conn = conn
		s.pid.Store(conn.PgConn().PID())
		var joined bool
		if err := conn.QueryRow(ctx, s.q.ShareJoin, s.group).Scan(&joined); err != nil {
			return fmt.Errorf("join the share group: %w", err)
		}
		if !joined {
			return errors.New("join the share group: its member lock is held exclusively")
		}
	}
	var n int64
	if err := s.conn.QueryRow(ctx, s.q.ShareMembers, s.group).Scan(&n); err != nil {
		return fmt.Errorf("count the share group's relays: %w", err)
	}
	n = max(n, 1)
	aim := int((Count + n - 1) / n)
	switch {
	case len(s.held) > aim:
		extra := s.held[aim:]
		// Stop preferring the shares before they are free: another relay may take them now.
		s.held = s.held[:aim]
		s.publish()
		var released int
		if err := s.conn.QueryRow(ctx, s.q.ShareRelease, s.group, extra).Scan(&released); err != nil {
			return fmt.Errorf("release claim shares: %w", err)
		}
		if released != len(extra) {
			return fmt.Errorf("release claim shares: held %d of %d", released, len(extra))
		}
	case len(s.held) < aim:
		rows, err := s.conn.Query(ctx, s.q.ShareTake, s.group, s.held, aim-len(s.held), s.from)
		if err != nil {
			return fmt.Errorf("take claim shares: %w", err)
		}
		var share int32
		if _, err := pgx.ForEachRow(rows, []any{&share}, func() error {
			s.held = append(s.held, share)
			return nil
		}); err != nil {
			return fmt.Errorf("take claim shares: %w", err)
		}
	}
	s.members.Store(n)
	s.publish()
	return nil
}

// publish makes the shares held the claimers' preference.
func (s *Set) publish() {
	var m Mask
	for _, i := range s.held {
		m |= 1 << i
	}
	s.mask.Store(int64(m))
}

// Close ends the session, releasing every lock it held.
func (s *Set) Close() {
	s.held = nil
	s.publish()
	s.members.Store(0)
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.conn.Close(ctx)
		s.conn = nil
		s.pid.Store(0)
	}
}
