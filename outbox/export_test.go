package outbox

import "github.com/keiro-go/keiro/outbox/internal/claimsql"

// claimsOf returns the claim relay's statements on s's schema.
func claimsOf(s *Store) *claimsql.Store { return &claimsql.Store{Q: s.q} }

// EnqueuesInLogMode reports whether s's next enqueue runs log mode's statement (Store.insert).
func EnqueuesInLogMode(s *Store) bool { return s.logEnqueue.Load() }

// OnSlotWait makes s call f each time it waits for a slot another session is creating.
func OnSlotWait(s *Store, f func()) { s.slotWait = f }

// LogSessions returns the sessions r's log-mode engine started (0 in claim mode).
func LogSessions(r *Relay) int64 {
	if r.logEngine == nil {
		return 0
	}
	return r.logEngine.Sessions()
}

// OnClaim makes r call f at the start of each claim statement's turn; call it before Run.
func OnClaim(r *Relay, f func()) { r.claimHook = f }

// OnMark makes r call f before each try of a batch's mark statement; call it before Run.
func OnMark(r *Relay, f func()) { r.markHook = f }
