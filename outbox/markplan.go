package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

// markPlan is the decision of one batch's mark (keiro §1.3.5 step 4, with rejection and outage
// handling): each row's outcome, as sqlMark takes it, and what the relay reports beside the
// transitions the write makes. planMarks makes it from the produce results alone, without
// PostgreSQL or Kafka; markOutcome applies it.
type markPlan struct {
	// marks are the outcomes to write, in batch order. A row that went dead in its claim has
	// none (the claim wrote it). A failure goes dead rather than failed in the write itself,
	// when the row's attempt count reached the ceiling (sqlMark).
	marks []mark
	// result has Claimed, Reclaimed, HaltedOn and OrderBroken set; the transitions are
	// counted from what the write moved.
	result BatchResult
	// deadOnClaim counts per destination the rows that went dead in the claim.
	deadOnClaim map[string]int
	// orderBroken are the rows Kafka acknowledged after an earlier row of their key in the
	// same flush did not get there (BatchResult.OrderBroken).
	orderBroken []orderBreak
	// suspects are the rows whose suspicion changes: true for a row refused for good in a
	// request shared with other records (produced alone next time), false for a row that is
	// no longer suspect (it was sent, or failed on its own).
	suspects map[envelope.UUID]bool
	// sent reports that a row reached Kafka, which ends a Kafka outage; outage, that a row
	// was deferred because Kafka is unavailable.
	sent, outage bool
}

// orderBreak is a row Kafka acknowledged after an earlier row of its key failed.
type orderBreak struct {
	row       *claimedRow
	partition int32
	offset    int64
}

// planMarks decides the outcome of every row of a batch from its produce results (results[i]
// is rows[i]'s) under policy:
//
//   - refused before the produce (too large): rejected;
//   - acknowledged by Kafka: sent, with its partition and offset;
//   - held back because an earlier row of its group (policy's ordering group) did not get
//     onto Kafka: skipped, its attempt refunded, with skippedError;
//   - not produced because its batch's lease was lost, or cancelled by the shutdown deadline:
//     released, and the rest of its group is held back; no outcome at all (shutdown before
//     the produce): released;
//   - refused by Kafka for good (a permanent error, unless the refusal may concern another
//     record of its request: see produceResult.suspect): rejected with the error's code;
//   - failed because Kafka is unavailable: deferred, its attempt refunded, after the delay
//     that deferFor sets (the relay's outage backoff, shared by its batches);
//   - any other failure: failed, due after retryDelay(attempt) (a failure on the last attempt
//     goes dead in the write).
//
// A failure other than a rejection holds back the rest of its group; under StopTheLine it also
// halts the relay on that row (BatchResult.HaltedOn), as does a row that went dead in the
// claim, whose last outcome is unknown.
func planMarks(rows []claimedRow, results []produceResult, policy Policy, retryDelay func(attempt int) time.Duration) markPlan {
	p := markPlan{
		marks:       make([]mark, 0, len(rows)),
		result:      BatchResult{Claimed: len(rows)},
		deadOnClaim: map[string]int{},
		suspects:    map[envelope.UUID]bool{},
	}
	halt := func(row *claimedRow) {
		if policy == StopTheLine && p.result.HaltedOn == nil {
			id := row.id.String()
			p.result.HaltedOn = &id
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
		if row.reclaimed {
			p.result.Reclaimed++
		}
		if row.dead {
			p.deadOnClaim[row.event.Destination]++
			if policy == StopTheLine && p.result.HaltedOn == nil {
				// Its last attempt's outcome is unknown (lease expired): review it before the rest.
				halt(row)
				failedGroups[groupKey(StopTheLine, &row.event)] = true
			}
			continue
		}
		pr := &results[i]
		g := groupKey(policy, &row.event)
		key := groupKey(PerKeyHeadOfLine, &row.event) // for the order-broken check, whatever the policy
		m := mark{id: row.id, dest: row.event.Destination}
		switch {
		case pr.rejectMsg != "":
			m.outcome, m.code, m.err = outcomeRejected, "message_too_large", pr.rejectMsg
		case pr.done && pr.err == nil:
			m.outcome, m.partition, m.offset = outcomeSent, pr.partition, pr.offset
			p.sent = true
			p.suspects[row.id] = false
			if key != "" && failedKeys[key] {
				p.result.OrderBroken++
				p.orderBroken = append(p.orderBroken, orderBreak{row: row, partition: pr.partition, offset: pr.offset})
			}
		case g != "" && failedGroups[g]:
			m.outcome, m.err = outcomeSkipped, skippedError
		case pr.leaseLost:
			// Not produced: the lease was lost or about to expire. Released if still ours.
			m.outcome = outcomeReleased
			if g != "" {
				failedGroups[g] = true
			}
		case !pr.done:
			m.outcome = outcomeReleased // shutdown before an outcome: back to pending
		case errors.Is(pr.err, context.Canceled):
			// The shutdown deadline cancelled the produce (franz-go fails at once the records
			// still waiting for metadata or a producer id): the row is released like one
			// without an outcome, and the rest of its group is held back.
			m.outcome = outcomeReleased
			if g != "" {
				failedGroups[g] = true
			}
		default:
			class, code := pr.failureClass()
			p.suspects[row.id] = pr.suspect()
			switch class {
			case classPermanent:
				m.outcome, m.code, m.err = outcomeRejected, code, errorText(pr.err)
			case classOutage:
				m.outcome, m.err = outcomeDeferred, errorText(pr.err)
				p.outage = true
			default:
				m.outcome, m.err = outcomeFailed, errorText(pr.err)
				m.delay = retryDelay(row.attempt)
			}
			if m.outcome != outcomeRejected {
				if g != "" {
					failedGroups[g] = true
				}
				halt(row)
			}
		}
		if m.outcome != outcomeSent && m.outcome != outcomeRejected && pr.done && key != "" {
			failedKeys[key] = true
		}
		p.marks = append(p.marks, m)
	}
	return p
}

// deferFor sets the delay of the rows deferred by a Kafka outage.
func (p *markPlan) deferFor(d time.Duration) {
	for i := range p.marks {
		if p.marks[i].outcome == outcomeDeferred {
			p.marks[i].delay = d
		}
	}
}

// retryIn is the shortest delay after which a row of the plan going back to failed is due
// (0: none is), when the claim loop should look again rather than wait for its next poll.
func (p *markPlan) retryIn() time.Duration {
	var d time.Duration
	for _, m := range p.marks {
		if (m.outcome == outcomeFailed || m.outcome == outcomeDeferred) && m.delay > 0 && (d == 0 || m.delay < d) {
			d = m.delay
		}
	}
	return d
}
