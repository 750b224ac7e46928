// Package sqlq holds every SQL statement of the outbox: the enqueue, the claims, the marks, the
// relay's sleep and share locks, maintenance, the admin operations and the inspection
// listings. [New] substitutes a validated schema name into each statement once; the outbox
// package runs them and never builds SQL itself.
package sqlq

import (
	"fmt"

	"github.com/keiro-go/keiro/internal/pgtext"
)

// Queries holds the statements with the schema substituted.
type Queries struct {
	// EnqueueMany writes several events (column arrays), EnqueueOne one (scalars), in claim
	// mode: sqlEnqueue. EnqueueLogMany and EnqueueLogOne are log mode's: sqlEnqueueLog.
	EnqueueMany, EnqueueOne       string
	EnqueueLogMany, EnqueueLogOne string
	// LockOutbox takes keiro_outbox's ROW EXCLUSIVE lock before log mode's statement.
	LockOutbox string
	// EmitOne and EmitMany write EmitTx's events as logical decoding messages (sqlEmitOne,
	// sqlEmitMany), after LockOutbox.
	EmitOne, EmitMany string
	// ClaimKey is the claim of the per-key policies (PerKeyHeadOfLine, StopTheLine),
	// ClaimSource that of PerSourceStream and ClaimAny that of BestEffort (sqlClaim).
	ClaimKey, ClaimSource, ClaimAny string
	// ClaimKeys is the per-key policies' claim past the front of the backlog (sqlClaimKeys).
	ClaimKeys          string
	Mark, Renew, Start string
	// MarkHistory is Mark for a batch with a failed or rejected row: it also appends each such
	// row's attempt to its history.
	MarkHistory string
	ReleaseLost string
	// RecoverableTxns and RecoverTxn are the exactly-once claim relay's recovery of lost claims
	// (sqlRecoverableTxns, sqlRecoverTxn).
	RecoverableTxns, RecoverTxn string
	Retention, Gauges           string
	// LogMark and LogRetention are log mode's retention of keiro_outbox_log.
	LogMark, LogRetention string
	Status, ListDead      string
	// StatusUnarchived is Status on a schema before migration 011 (no archived_at), which
	// HasArchive tells apart.
	StatusUnarchived, HasArchive string
	Requeue                      string
	// Reject sets open rows aside for good at a caller's request (sqlReject, Admin.Reject).
	Reject string
	// SleepLock and SleepUnlock take and release sleepLockAll; the filtered forms, sleepLockFiltered.
	SleepLock, SleepUnlock                 string
	SleepLockFiltered, SleepUnlockFiltered string

	// DeclareSource, RevokeSource and ListSources manage keiro_outbox_source.
	DeclareSource, RevokeSource, ListSources string

	// ShareJoin, ShareMembers, ShareTake and ShareRelease manage a relay's claim shares.
	ShareJoin, ShareMembers, ShareTake, ShareRelease string

	// ListOutbox, ListOutboxNewest, SearchOutbox, CountDead, ListStuckOutbox, ListSentGcCandidates and
	// Activity are the inspection listings (list.go).
	ListOutbox, ListOutboxNewest, SearchOutbox, CountDead string
	// FailureGroups and FailureGroupIDs group the dead and rejected rows by error (groups.go).
	FailureGroups, FailureGroupIDs string
	// Archive sets aside dead and rejected rows (Admin.ArchiveTx); AttemptErrors reads a row's
	// failed attempts (Admin.AttemptHistory).
	Archive, AttemptErrors                string
	ListStuckOutbox, ListSentGcCandidates string
	Activity                              string
	// ReadMode and SetMode read and change the schema's mode (claim or log); AnyOpen tells
	// whether keiro_outbox has open rows. CreateSlot and SlotStatus take the slot's name as a
	// parameter; the publication's statements are logslot's (SQLPublication, ...).
	ReadMode, SetMode, AnyOpen string
	// ReadModeForUpdate reads the mode and the time it was set, and locks its row (the start
	// of a change).
	ReadModeForUpdate string
	// RecoverLog copies keiro_outbox_log's rows of a time range into keiro_outbox (sqlRecoverLog).
	RecoverLog string
	// DeadLetter writes an event of keiro_outbox_log that Kafka refused for good as a
	// rejected row of keiro_outbox (the log-mode relay's dead letter).
	DeadLetter             string
	CreateSlot, SlotStatus string
	// RowFilters and LogSlots are per-destination log mode's: whether the server has
	// publication row filters, and the schema's log slots.
	RowFilters, LogSlots string
	// DropSlot drops an inactive replication slot; DropPublication a publication, whose
	// {{publication}} the caller substitutes. Clock reads the database's clock.
	DropSlot, DropPublication, Clock string
	// LookupRow and EnqueueExistingRows read whole rows of RowColumns. ListOutbox,
	// ListOutboxNewest (their $9) and SearchOutbox (its $3) read a prefix of each payload
	// (pgtext.PrefixSQL); the other listings read whole payloads.
	LookupRow, EnqueueExistingRows string
}

// New returns the statements of the outbox in schema, which the caller has validated
// (migrations.ValidateSchema).
func New(schema string) *Queries {
	// Each statement is assembled in layers (pgtext.Partial) and finished by r, which fills the
	// schema and the payload column and refuses any placeholder left (pgtext.Expand).
	expand := func(q string) string {
		return pgtext.Partial(q, "claimable_r", fmt.Sprintf(claimable, "r"), "claimable_h", fmt.Sprintf(claimable, "h"))
	}
	r := func(q string) string { return pgtext.Expand(q, "schema", schema, "payload", "payload_bytes") }
	prefix := func(q string, param int) string {
		return pgtext.Expand(q, "schema", schema, "payload", pgtext.PrefixSQL("payload_bytes", param))
	}
	locks := func(q string) string {
		return pgtext.Partial(q, "key_lock", keyLock, "sleep_lock_all", sleepLockAll, "sleep_lock_filtered", sleepLockFiltered,
			"share_member_lock", shareMemberLock, "share_lock", shareLock)
	}
	claim := func(join, pre, post, share string) string {
		headSeq := "NULL::bigint"
		if join != "" {
			headSeq = "head.seq"
		}
		q := pgtext.Partial(sqlClaim+sqlClaimTail, "prejoin", join, "pre", pre, "post", post, "head_seq", headSeq,
			"ran_last", ranLast, "in_share_r", fmt.Sprintf(InShare, "$7", fmt.Sprintf(share, "r")))
		return r(expand(q))
	}
	claimKeys := r(expand(pgtext.Partial(sqlClaimKeys+sqlClaimTail, "post", postKey, "ran_last", ranLast,
		"in_share_r", fmt.Sprintf(InShare, "$6", fmt.Sprintf(ShareOfKey, "r")),
		"in_share_h", fmt.Sprintf(InShare, "$6", fmt.Sprintf(ShareOfKey, "h")))))
	// many is sqlEnqueueMany with its payloads in parameter p: claim mode's statement takes the
	// key-lock and notify flags before it ($23, $24), log mode's takes neither.
	many := func(p string) string { return pgtext.Partial(sqlEnqueueMany, "payloads", p) }
	enqueue := func(q, input string) string { return pgtext.Partial(q, "input", input) }
	sleepKey := func(q, key string) string { return pgtext.Partial(q, "key", key) }
	return &Queries{
		FailureGroups:        r(failureRows.GroupsSQL()),
		FailureGroupIDs:      r(failureRows.KeysSQL()),
		EnqueueMany:          r(locks(enqueue(sqlEnqueue, many("$25")))),
		EnqueueOne:           r(locks(enqueue(sqlEnqueue, sqlEnqueueOne))),
		EnqueueLogMany:       r(enqueue(sqlEnqueueLog, many("$23"))),
		EnqueueLogOne:        r(enqueue(sqlEnqueueLog, sqlEnqueueOne)),
		LockOutbox:           r(sqlLockOutbox),
		EmitOne:              r(sqlEmitOne),
		EmitMany:             r(sqlEmitMany),
		DeclareSource:        r(sqlDeclareSource),
		RevokeSource:         r(sqlRevokeSource),
		ListSources:          r(sqlListSources),
		ClaimKey:             claim(preJoinKey, preKey, postKey, ShareOfKey),
		ClaimSource:          claim(preJoinSource, preSource, postSource, shareOfSource),
		ClaimAny:             claim("", "TRUE", postNone, shareOfSeq),
		ClaimKeys:            claimKeys,
		Mark:                 r(pgtext.Partial(sqlMark, "attempt_errors", "")),
		MarkHistory:          r(pgtext.Partial(sqlMark, "attempt_errors", markHistory)),
		Renew:                r(sqlRenew),
		Start:                r(sqlStartProduce),
		ReleaseLost:          r(sqlReleaseLostClaim),
		RecoverableTxns:      r(sqlRecoverableTxns),
		RecoverTxn:           r(sqlRecoverTxn),
		Retention:            r(sqlRetention),
		LogMark:              r(sqlLogMark),
		LogRetention:         r(sqlLogRetention),
		Gauges:               r(sqlGauges),
		Status:               r(sqlStatus),
		StatusUnarchived:     r(sqlStatusUnarchived),
		HasArchive:           r(sqlHasArchive),
		ListDead:             r(sqlListDead),
		Requeue:              r(sqlRequeue),
		Reject:               r(sqlReject),
		SleepLock:            r(sleepKey(sqlSleepLock, sleepLockAll)),
		SleepUnlock:          r(sleepKey(sqlSleepUnlock, sleepLockAll)),
		SleepLockFiltered:    r(sleepKey(sqlSleepLock, sleepLockFiltered)),
		SleepUnlockFiltered:  r(sleepKey(sqlSleepUnlock, sleepLockFiltered)),
		ShareJoin:            r(locks(sqlShareJoin)),
		ShareMembers:         r(locks(sqlShareMembers)),
		ShareTake:            r(locks(sqlShareTake)),
		ShareRelease:         r(locks(sqlShareRelease)),
		ReadMode:             r(sqlReadMode),
		ReadModeForUpdate:    r(sqlReadModeForUpdate),
		SetMode:              r(sqlSetMode),
		AnyOpen:              r(sqlAnyOpen),
		RecoverLog:           r(sqlRecoverLog),
		DeadLetter:           r(enqueue(sqlDeadLetter, sqlEnqueueOne)),
		CreateSlot:           sqlCreateSlot,
		SlotStatus:           sqlSlotStatus,
		RowFilters:           sqlRowFilters,
		LogSlots:             r(sqlLogSlots),
		DropSlot:             sqlDropSlot,
		DropPublication:      sqlDropPublication,
		Clock:                sqlClock,
		ListOutbox:           prefix(sqlListOutbox, 9),
		ListOutboxNewest:     prefix(sqlListOutboxNewest, 9),
		SearchOutbox:         prefix(sqlSearchOutbox, 3),
		CountDead:            r(sqlCountDead),
		Archive:              r(sqlArchive),
		AttemptErrors:        r(sqlAttemptErrors),
		ListStuckOutbox:      r(sqlListStuckOutbox),
		ListSentGcCandidates: r(sqlListSentGcCandidates),
		Activity:             r(sqlActivity),
		LookupRow:            r(sqlLookupRow),
		EnqueueExistingRows:  r(sqlEnqueueExistingRows),
	}
}
