package outbox

// The advisory lock keys of the relays' claim shares (shares.go). They are session-level
// locks in the two-int4 key space (pg_advisory_lock(int4, int4), pg_locks.objsubid = 2), a
// key space apart from the one-int8 keys of the per-key enqueue locks (sqlEnqueue, the
// outbox_order trigger) and of the maintenance lock; the sleep locks (sleepLockAll,
// sleepLockFiltered in sql.go) share this key space with them, under other first keys.
//
// Every key names the schema ({{schema}}) and the relay's share group ($1: "" for relays that
// publish every destination, else their sorted destinations joined by ","): relays of one
// group partition the backlog between them, relays of different groups never see each
// other's locks.
//
//   - shareMemberClass, shareMemberObject: the group's member lock, held shared by every relay
//     of the group on its share session for as long as it runs; the number of its holders
//     (pg_locks) is the group's size.
//   - shareClass: the first key of the group's claimShares share locks, the second key being
//     the share's number (0..claimShares-1); a share's lock is held exclusively by the relay
//     that prefers its rows.
//
// A session that ends (the relay stopped or died, its backend was terminated) loses its locks
// with it: the group shrinks and its shares are free for the others to take.
const (
	shareMemberClass  = `hashtext('keiro.outbox.share.member')`
	shareMemberObject = `hashtext('{{schema}}' || chr(31) || $1::text)`
	shareClass        = `hashtext('keiro.outbox.share' || chr(31) || '{{schema}}' || chr(31) || $1::text)`
)
