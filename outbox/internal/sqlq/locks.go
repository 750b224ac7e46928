package sqlq

import "github.com/keiro-go/keiro/internal/advisorylock"

// The outbox's advisory lock keys, as SQL expressions from the one registry of keiro's keys
// (internal/advisorylock). Every key names the schema through schemaLiteral, replaced with the
// schema name by [New] like every {{schema}} placeholder.
//
//   - keyLock: the bigint lock of one (source, key), taken by the locks CTE of sqlEnqueue as
//     the outbox_order trigger takes it.
//   - sleepLockAll, sleepLockFiltered (sql.go): the two-int4 sleep locks.
//   - shareMemberLock, shareLock: the two-int4 locks of the relays' claim shares
//     (outbox/internal/shares).
//     They are session-level locks named by the relay's share group ($1: "" for relays that
//     publish every destination, else their sorted destinations joined by ","): relays of one
//     group partition the backlog between them, relays of different groups never see each
//     other's locks. shareMemberLock is the group's member lock, held shared by every relay of
//     the group on its share session for as long as it runs; the number of its holders
//     (pg_locks) is the group's size. shareLock is the lock of share s (0..claimShares-1), held
//     exclusively by the relay that prefers its rows.
//
// A session that ends (the relay stopped or died, its backend was terminated) loses its locks
// with it: the group shrinks and its shares are free for the others to take.
var (
	// schemaLiteral is the schema as a SQL string literal.
	schemaLiteral   = advisorylock.Literal("{{schema}}")
	keyLock         = advisorylock.OutboxKey(schemaLiteral, "source", "message_key")
	shareMemberLock = advisorylock.OutboxShareMember(schemaLiteral, "$1::text")
	shareLock       = advisorylock.OutboxShare(schemaLiteral, "$1::text", "s")
)
