// Package advisorylock names every PostgreSQL advisory lock key keiro takes, in one file, so
// that no two concerns share a key by accident and the SQL and Go sides of one lock cannot
// drift apart (keys_test.go checks them against the migrations' functions and the packages'
// statements on a live PostgreSQL).
//
// PostgreSQL has two key spaces that never collide: one bigint (pg_advisory_lock(int8);
// pg_locks.objsubid = 1) and two integers (pg_advisory_lock(int4, int4); objsubid = 2). The
// one-bigint keys are hashtextextended(text, 0) of a text that starts with the schema or with
// a "keiro.<component>." prefix; the two-integer keys are hashtext of a "keiro.<component>"
// class and hashtext of an object within it.
//
// The functions here return SQL expressions built from SQL argument expressions (a quoted
// literal such as '{{schema}}', a column, a $n parameter): a statement that takes a lock
// writes pg_advisory_xact_lock(<expression>). Key texts never change once released: a key is
// how two versions of keiro, or a relay and a producer written in another language, exclude
// each other.
//
// Keys taken (a new lock gets its function here and a case in keys_test.go):
//
//	key                   space    taken by
//	OutboxKey             bigint   EnqueueTx and the keiro_outbox_order trigger, per (source, key)
//	OutboxSource          bigint   the keiro_outbox_order trigger, per declared source
//	OutboxSleepAll        int4×2   a sleeping relay (exclusive); producers try it shared
//	OutboxSleepFiltered   int4×2   the same, for relays restricted to some destinations
//	OutboxShareMember     int4×2   every relay of a share group, shared (outbox/internal/shares)
//	OutboxShare           int4×2   the relay preferring one share of its group's backlog
//	OutboxMaintenance     bigint   one relay's retention or gauge statement per schema
//	InboxRetention        bigint   one consumer's retention transaction per (schema, consumer)
//	Subscription          bigint   the one running instance of an event-store subscription
//	Migrate               bigint   the migration runner, per schema
package advisorylock

import (
	"hash/fnv"
	"strings"
)

// Literal quotes s as a SQL string literal, for a key whose part is known in Go (a schema
// validated by migrations.ValidateSchema, a fixed name).
func Literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// OutboxKey is the bigint lock of one (source, key) of an outbox: every insert of a keyed row
// takes it until its transaction ends, so rows of one key are numbered (seq) in commit order.
// chr(31) separates the parts.
func OutboxKey(schema, source, key string) string {
	return "hashtextextended(" + schema + " || chr(31) || " + source + " || chr(31) || " + key + ", 0)"
}

// OutboxSource is the bigint lock of one source declared per-source ordered
// (keiro_outbox_source): every insert of the source takes it. chr(30) separates the parts, so
// it never equals an OutboxKey.
func OutboxSource(schema, source string) string {
	return "hashtextextended(" + schema + " || chr(30) || " + source + ", 0)"
}

// OutboxSleepAll is the two-integer sleep lock of the relays that publish every destination
// (the two arguments of pg_advisory_lock(int4, int4)): a relay holds it exclusively while it
// sleeps, and a producer that can take it shared knows no such relay sleeps and skips the
// NOTIFY.
func OutboxSleepAll(schema string) string {
	return "hashtext('keiro.outbox.sleep'), hashtext(" + schema + ")"
}

// OutboxSleepFiltered is OutboxSleepAll for the relays restricted to some destinations.
func OutboxSleepFiltered(schema string) string {
	return "hashtext('keiro.outbox.sleep.filtered'), hashtext(" + schema + ")"
}

// OutboxShareMember is the two-integer member lock of a relay share group (group: "" for the
// relays of every destination, else their sorted destinations joined by ","), held shared by
// each relay of the group for as long as it runs.
func OutboxShareMember(schema, group string) string {
	return "hashtext('keiro.outbox.share.member'), hashtext(" + schema + " || chr(31) || " + group + ")"
}

// OutboxShare is the two-integer lock of one share of a share group's backlog (share: its
// number), held exclusively by the relay that prefers its rows.
func OutboxShare(schema, group, share string) string {
	return "hashtext('keiro.outbox.share' || chr(31) || " + schema + " || chr(31) || " + group + "), " + share
}

// OutboxMaintenance is the bigint lock that lets one relay per schema at a time run a
// maintenance statement (retention, gauges), each for its own transaction. It is computed in
// Go (FNV-1a of "keiro.outbox.maintenance.<schema>") and passed as a parameter.
func OutboxMaintenance(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("keiro.outbox.maintenance." + schema))
	return int64(h.Sum64())
}

// InboxRetention is the bigint lock that lets one consumer instance per (schema, consumer)
// at a time delete completed inbox rows, each for its own transaction.
func InboxRetention(schema, consumer string) string {
	return "hashtextextended('keiro.inbox.retention.' || " + schema + " || '.' || " + consumer + ", 0)"
}

// Subscription is the bigint session lock held by the one running instance of an event-store
// subscription (name) in a schema.
func Subscription(schema, name string) string {
	return "hashtextextended(" + schema + " || '.keiro_subscriptions.' || " + name + ", 0)"
}

// Migrate is the bigint session lock the migration runner holds while it migrates a schema.
func Migrate(schema string) string {
	return "hashtextextended('keiro.migrate.' || " + schema + ", 0)"
}

// WorkflowStep is the bigint transaction lock that serialises the writers of one workflow step
// (name, id, generation, step: SQL text expressions) until their transactions end.
func WorkflowStep(name, id, generation, step string) string {
	return "hashtextextended('keiro.workflow.step' || chr(31) || " + name + " || chr(31) || " + id +
		" || chr(31) || " + generation + " || chr(31) || " + step + ", 0)"
}
