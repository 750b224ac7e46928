// Package markplan decides what becomes of each row of a relay batch once its produce is over
// (keiro §1.3.5 step 4, with rejection and outage handling): sent, retried, held back behind
// an earlier failure of its ordering group, released, deferred through a Kafka outage, or
// rejected. It reads no database and no Kafka: the outbox package writes the plan in one
// statement fenced by the batch's claim token, and reports the transitions that write made.
package markplan

import (
	"context"
	"errors"
	"time"

	"github.com/keiro-go/keiro/internal/pgtext"
	"github.com/keiro-go/keiro/outbox/internal/kafkaerr"
)

// Outcome is the outcome of one row, as the mark statement takes it.
type Outcome uint8

const (
	// Sent: Kafka acknowledged the record.
	Sent Outcome = iota + 1
	// Failed: the row is retried after its backoff, or goes dead when it was on its last
	// attempt (the write decides from the row's attempt count).
	Failed
	// Skipped: held back because an earlier row of its group failed; failed, due now, its
	// attempt refunded.
	Skipped
	// Released: not produced; pending again, due now, its attempt refunded.
	Released
	// Rejected: refused for good; terminal.
	Rejected
	// Deferred: failed while Kafka is unavailable; due after the relay's outage backoff, its
	// attempt refunded.
	Deferred
)

var outcomeNames = [...]string{Sent: "sent", Failed: "failed", Skipped: "skipped",
	Released: "released", Rejected: "rejected", Deferred: "deferred"}

// String returns the outcome's name, as the mark statement reads it.
func (o Outcome) String() string { return outcomeNames[o] }

// SkippedError is the last error of a row held back because an earlier row of its group
// failed (keiro's text, used for every policy).
const SkippedError = "skipped: earlier record for the same key failed"

// MaxErrorBytes bounds an error text stored as a row's last error.
const MaxErrorBytes = 1024

// ErrorText is err's text as stored as a row's last error: valid UTF-8 without NUL bytes, cut
// on a character boundary (a byte cut through a character would make PostgreSQL refuse the
// mark).
func ErrorText(err error) string {
	return pgtext.Storable(err.Error(), MaxErrorBytes)
}

// Row is a claimed row, as far as its outcome depends on it.
type Row struct {
	// Group is the row's ordering group under the relay's policy: a failure holds back the
	// later rows of its group. "" is a group of its own.
	Group string
	// Key is the row's (source, key), whatever the policy ("" without a key): Kafka holds a
	// key out of order when a row of it is acknowledged after an earlier one failed.
	Key string
	// Attempt is the row's attempt count, this attempt included.
	Attempt int
	// Reclaimed: the row was claimed from an expired lease.
	Reclaimed bool
	// Dead: the row went dead in its claim (its lease expired on its last attempt after its
	// produce started); it was not produced and is not marked.
	Dead bool
}

// Result is a row's produce result.
type Result struct {
	// Done: the produce finished, with Err or at Partition and Offset.
	Done      bool
	Err       error
	Partition int32
	Offset    int64
	// RejectCode and RejectMsg are the code and reason of a row refused before its produce
	// (an illegal topic, a record too large); RejectCode "" is message_too_large.
	RejectCode, RejectMsg string
	// Shared: other records of the flush went to the same partition, so a record-level
	// refusal cannot be pinned on this record (kafkaerr.Suspect).
	Shared bool
	// LeaseLost: the row was not produced because its batch's lease was lost or about to
	// expire.
	LeaseLost bool
}

// Mark is one row's outcome, ready to write.
type Mark struct {
	// Row is the row's index in the batch.
	Row     int
	Outcome Outcome
	// Err is the error text stored as the row's last error; Code the rejection code.
	Err, Code string
	// Delay is how long a failed or deferred row waits before it is due again.
	Delay time.Duration
	// Partition and Offset are where Kafka stored a sent row.
	Partition int32
	Offset    int64
}

// Plan is the decision of a batch's mark.
type Plan struct {
	// Marks are the outcomes to write, in batch order: every row but those dead in their
	// claim (the claim wrote them).
	Marks []Mark
	// Dead are the rows that went dead in their claim; Reclaimed counts the rows claimed
	// from an expired lease.
	Dead      []int
	Reclaimed int
	// HaltedOn is the row that halts a StopTheLine relay, -1 for none.
	HaltedOn int
	// OrderBroken are the rows Kafka acknowledged after an earlier row of their key in the
	// same flush did not get there.
	OrderBroken []int
	// Suspects are the rows whose suspicion changes: true for a row refused for good in a
	// request shared with other records (produced alone next time), false for a row no
	// longer suspect (it was sent, or failed on its own).
	Suspects map[int]bool
	// Sent reports that a row reached Kafka, which ends a Kafka outage; Outage, that a row
	// was deferred because Kafka is unavailable.
	Sent, Outage bool
}

// Decide decides the outcome of every row of a batch from its produce results (results[i] is
// rows[i]'s):
//
//   - refused before the produce (too large): rejected;
//   - acknowledged by Kafka: sent, with its partition and offset;
//   - held back because an earlier row of its group did not get onto Kafka: skipped;
//   - not produced because its batch's lease was lost, or cancelled by the shutdown
//     deadline: released, and the rest of its group is held back; no outcome at all
//     (shutdown before the produce): released;
//   - refused by Kafka for good (unless the refusal may concern another record of its
//     request: kafkaerr.OfRecord): rejected with the error's code;
//   - failed because Kafka is unavailable: deferred, after the delay DeferFor sets (the
//     relay's outage backoff, which its batches share);
//   - any other failure: failed, due after retryDelay(attempt).
//
// A failure other than a rejection holds back the rest of its group; with stopTheLine it
// also halts the relay on that row, as does a row that went dead in its claim, whose last
// outcome is unknown.
func Decide(rows []Row, results []Result, stopTheLine bool, retryDelay func(attempt int) time.Duration) Plan {
	p := Plan{Marks: make([]Mark, 0, len(rows)), HaltedOn: -1, Suspects: map[int]bool{}}
	halt := func(i int) {
		if stopTheLine && p.HaltedOn < 0 {
			p.HaltedOn = i
		}
	}
	failedGroups := map[string]bool{}
	// failedKeys holds the keys with a row this flush did not get onto Kafka, to catch a later
	// row of the same key that did: Kafka would then hold the key out of order. franz-go fails
	// every later record of a partition after a failed one, so this should never happen; if a
	// broker or client ever breaks that, operators hear of it.
	failedKeys := map[string]bool{}
	for i := range rows {
		row := &rows[i]
		if row.Reclaimed {
			p.Reclaimed++
		}
		if row.Dead {
			p.Dead = append(p.Dead, i)
			if stopTheLine && p.HaltedOn < 0 {
				// Its last attempt's outcome is unknown (lease expired): review it before the rest.
				halt(i)
				failedGroups[row.Group] = true
			}
			continue
		}
		pr := &results[i]
		g := row.Group
		m := Mark{Row: i}
		switch {
		case pr.RejectMsg != "":
			m.Outcome, m.Code, m.Err = Rejected, pr.RejectCode, pr.RejectMsg
			if m.Code == "" {
				m.Code = "message_too_large"
			}
		case pr.Done && pr.Err == nil:
			m.Outcome, m.Partition, m.Offset = Sent, pr.Partition, pr.Offset
			p.Sent = true
			p.Suspects[i] = false
			if row.Key != "" && failedKeys[row.Key] {
				p.OrderBroken = append(p.OrderBroken, i)
			}
		case g != "" && failedGroups[g]:
			m.Outcome, m.Err = Skipped, SkippedError
		case pr.LeaseLost:
			// Not produced: the lease was lost or about to expire. Released if still ours.
			m.Outcome = Released
			if g != "" {
				failedGroups[g] = true
			}
		case !pr.Done:
			m.Outcome = Released // shutdown before an outcome: back to pending
		case errors.Is(pr.Err, context.Canceled):
			// The shutdown deadline cancelled the produce (franz-go fails at once the records
			// still waiting for metadata or a producer id): the row is released like one
			// without an outcome, and the rest of its group is held back.
			m.Outcome = Released
			if g != "" {
				failedGroups[g] = true
			}
		default:
			suspect, outage := failure(&m, pr, row.Attempt, retryDelay)
			p.Suspects[i] = suspect
			p.Outage = p.Outage || outage
			if m.Outcome != Rejected {
				if g != "" {
					failedGroups[g] = true
				}
				halt(i)
			}
		}
		if m.Outcome != Sent && m.Outcome != Rejected && pr.Done && row.Key != "" {
			failedKeys[row.Key] = true
		}
		p.Marks = append(p.Marks, m)
	}
	return p
}

// failure sets m's outcome for a produce that failed (pr): rejected for good, deferred by a
// Kafka outage (no attempt used), or failed and retried after retryDelay(attempt). It reports
// whether the row is a suspect (kafkaerr.Suspect) and whether Kafka is out.
func failure(m *Mark, pr *Result, attempt int, retryDelay func(attempt int) time.Duration) (suspect, outage bool) {
	class, code := kafkaerr.OfRecord(pr.Err, pr.Shared)
	switch class {
	case kafkaerr.Permanent:
		m.Outcome, m.Code, m.Err = Rejected, code, ErrorText(pr.Err)
	case kafkaerr.Outage:
		m.Outcome, m.Err = Deferred, ErrorText(pr.Err)
		outage = true
	default:
		m.Outcome, m.Err = Failed, ErrorText(pr.Err)
		m.Delay = retryDelay(attempt)
	}
	return kafkaerr.Suspect(pr.Err, pr.Shared), outage
}

// DeferFor sets the delay of the rows deferred by a Kafka outage.
func (p *Plan) DeferFor(d time.Duration) {
	for i := range p.Marks {
		if p.Marks[i].Outcome == Deferred {
			p.Marks[i].Delay = d
		}
	}
}

// RetryIn is the shortest delay after which a row of the plan going back to failed is due (0:
// none is), when the relay should claim again rather than wait for its next poll.
func (p *Plan) RetryIn() time.Duration {
	var d time.Duration
	for _, m := range p.Marks {
		if (m.Outcome == Failed || m.Outcome == Deferred) && m.Delay > 0 && (d == 0 || m.Delay < d) {
			d = m.Delay
		}
	}
	return d
}
