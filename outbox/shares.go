package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/outbox/internal/sleep"
	"github.com/keiro-go/keiro/outbox/internal/sqlq"
)

// Claim shares: how the relays on one outbox split a backlog instead of racing over its front.
//
// The rows of an outbox fall into shareCount shares by a hash computed in the claim itself (no
// column: shareOfKey, shareOfSource and shareOfSeq in internal/sqlq): under the per-key policies a
// key's rows are all in one share. The relays that publish the same destinations form a share
// group; each holds the group's member lock shared and some of its share locks exclusively, on
// a session of its own (locks.go), and aims at ceil(shareCount / members) shares: at every
// balance step (every poll interval, at most a second) it counts the members, releases the
// shares over its aim and tries free ones up to it. A relay that stops, dies or loses its
// session loses its locks with it, so the others take its shares at their next step.
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

// shareCount is the number of claim shares of a group: enough that relays split them evenly
// (1 to 8 relays get equal or nearly equal parts) and few enough for a bit set in one bigint.
// The share SQL (internal/sqlq) spells it as 64 and 63.
const shareCount = 64

// shareMask is a set of claim shares: bit i is share i.
type shareMask uint64

// allShares is every share: an unrestricted claim.
const allShares = ^shareMask(0)

// count is the number of shares in m.
func (m shareMask) count() int { return bits.OnesCount64(uint64(m)) }

// shareGroup is the share group of relays restricted to destinations: "" for every destination,
// else the distinct destinations in order, joined by "," (topic names have no comma).
func shareGroup(destinations []string) string {
	d := slices.Clone(destinations)
	slices.Sort(d)
	return strings.Join(slices.Compact(d), ",")
}

// shareBalanceInterval bounds the time between two balance steps (the poll interval, if
// shorter): how long a dead relay's shares stay orphaned, and a new relay waits for its part.
const shareBalanceInterval = time.Second

// shareSet is one relay's membership of its share group and the shares it holds, on a session
// of its own, opened at the first balance step and reopened after an error. Only the balance
// loop uses the session; claimers read mask.
type shareSet struct {
	cfg   *pgx.ConnConfig
	q     *sqlq.Queries
	group string
	conn  *pgx.Conn
	// held are the shares held, in the order taken; the last taken are released first.
	held []int32
	// from is where this relay starts looking for free shares, so relays joining together
	// try different shares first.
	from int32
	// mask is held as a shareMask (0 while no session holds any); members, the group's size
	// at the last step.
	mask, members atomic.Int64
	// pid is the share session's backend (0 while there is none), for diagnostics.
	pid atomic.Uint32
}

// newShareSet returns the share set of a relay restricted to destinations, whose session
// connects with cfg.
func newShareSet(cfg *pgx.ConnConfig, q *sqlq.Queries, destinations []string) *shareSet {
	return &shareSet{cfg: cfg, q: q, group: shareGroup(destinations), from: rand.Int32N(shareCount)}
}

// shares returns the shares held now (0: none, the claim is unrestricted).
func (s *shareSet) shares() shareMask { return shareMask(s.mask.Load()) }

// balance runs one balance step: it joins the group if it is not a member, counts the
// members, and releases the shares over its aim or tries free ones up to it. On an error the
// session is closed, which releases every lock it held, and the relay holds no share until a
// later step succeeds.
func (s *shareSet) balance(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, sleep.StatementTimeout)
	defer cancel()
	err := s.step(ctx)
	if err != nil {
		s.close()
	}
	return err
}

func (s *shareSet) step(ctx context.Context) error {
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
	aim := int((shareCount + n - 1) / n)
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
func (s *shareSet) publish() {
	var m shareMask
	for _, i := range s.held {
		m |= 1 << i
	}
	s.mask.Store(int64(m))
}

// close ends the session, releasing every lock it held.
func (s *shareSet) close() {
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

// balanceShares runs the relay's balance steps until ctx ends, then closes the share session,
// so the other relays take its shares at their next step.
func (r *Relay) balanceShares(ctx context.Context) {
	s := r.shares
	defer s.close()
	every := min(r.cfg.PollInterval, shareBalanceInterval)
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		if r.shareHook != nil {
			r.shareHook(ctx)
		}
		if err := s.balance(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				failing = true
				r.log.WarnContext(ctx, "claim shares unavailable; claiming from every share until they are back", "err", err)
			}
		} else if failing {
			failing = false
			r.log.InfoContext(ctx, "claim shares available again")
		}
		r.log.DebugContext(ctx, "claim shares balanced", "held", s.shares().count(), "members", s.members.Load())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// claimShares is the restriction of the next claim: the relay's own shares while it prefers
// them (the backlog is deep, they were not found drained lately, it holds some but not all),
// else every share.
func (r *Relay) claimShares(preferOwn bool, ownDryUntil time.Time) shareMask {
	if !preferOwn || r.shares == nil || r.now().Before(ownDryUntil) {
		return allShares
	}
	if m := r.shares.shares(); m != 0 {
		return m
	}
	return allShares
}
