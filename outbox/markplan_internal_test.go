package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keiro-go/keiro/envelope"
)

// planRow is a claimed row named name (its message id; its outbox id is derived from it), of
// source "s", destination "t1" and key key ("" for none), on its first attempt.
func planRow(name, key string) claimedRow {
	var id envelope.UUID
	copy(id[:], name)
	e := envelope.Event{MessageID: name, Source: "s", Destination: "t1"}
	if key != "" {
		e.Key = &key
	}
	return claimedRow{id: id, attempt: 1, event: e}
}

func withAttempt(r claimedRow, n int) claimedRow   { r.attempt = n; return r }
func withSource(r claimedRow, s string) claimedRow { r.event.Source = s; return r }
func deadInClaim(r claimedRow) claimedRow          { r.dead, r.reclaimed = true, true; return r }

// The produce errors of the plans below: retried, a Kafka outage, refused for good.
var (
	errRetriable = errors.New("broker said no")
	errOutage    = kerr.NotLeaderForPartition
	errRefusal   = kerr.TopicAuthorizationFailed
)

func sentAt(part int32, off int64) produceResult {
	return produceResult{done: true, partition: part, offset: off}
}
func failedWith(err error) produceResult { return produceResult{done: true, err: err} }

// planned is one row's expected mark.
type planned struct {
	row     string
	outcome outcome
	err     string
	code    string
	delay   time.Duration
	part    int32
	off     int64
}

// retryDelay is a backoff without jitter, so the plan's delays are exact: the attempt in
// seconds.
func retryDelay(attempt int) time.Duration { return time.Duration(attempt) * time.Second }

// TestPlanMarks: each produce result gives its row's outcome, a failure holds back the later
// rows of its group (per policy) and halts StopTheLine, and the plan reports what the relay
// logs and counts beside the write.
func TestPlanMarks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		policy  Policy
		rows    []claimedRow
		results []produceResult
		want    []planned
		// halted names the row BatchResult.HaltedOn names, if any.
		halted      string
		orderBroken []string
		deadOnClaim map[string]int
		suspects    map[string]bool
		sent        bool
		outage      bool
		reclaimed   int
	}{{
		name:    "acknowledged rows are sent",
		rows:    []claimedRow{planRow("a1", "A"), planRow("b1", "B")},
		results: []produceResult{sentAt(3, 70), sentAt(1, 12)},
		want: []planned{{row: "a1", outcome: outcomeSent, part: 3, off: 70},
			{row: "b1", outcome: outcomeSent, part: 1, off: 12}},
		suspects: map[string]bool{"a1": false, "b1": false},
		sent:     true,
	}, {
		name:    "a row too large is rejected before its produce and holds back nothing",
		rows:    []claimedRow{planRow("a1", "A"), planRow("a2", "A")},
		results: []produceResult{{rejectMsg: "record of 2 MiB exceeds 1 MiB"}, sentAt(0, 1)},
		want: []planned{{row: "a1", outcome: outcomeRejected, code: "message_too_large", err: "record of 2 MiB exceeds 1 MiB"},
			{row: "a2", outcome: outcomeSent, off: 1}},
		suspects: map[string]bool{"a2": false},
		sent:     true,
	}, {
		name:    "a refusal for good is rejected with its code and holds back nothing",
		rows:    []claimedRow{planRow("a1", "A"), planRow("a2", "A")},
		results: []produceResult{failedWith(errRefusal), sentAt(0, 1)},
		want: []planned{{row: "a1", outcome: outcomeRejected, code: "topic_authorization_failed", err: errorText(errRefusal)},
			{row: "a2", outcome: outcomeSent, off: 1}},
		suspects: map[string]bool{"a1": false, "a2": false},
		sent:     true,
	}, {
		name:    "a errRetriable failure is retried after its attempt's backoff and holds back its key",
		rows:    []claimedRow{withAttempt(planRow("a1", "A"), 2), planRow("b1", "B"), planRow("a2", "A"), planRow("a3", "A")},
		results: []produceResult{failedWith(errRetriable), sentAt(0, 5), failedWith(errRetriable), {}},
		want: []planned{{row: "a1", outcome: outcomeFailed, err: "broker said no", delay: 2 * time.Second},
			{row: "b1", outcome: outcomeSent, off: 5},
			{row: "a2", outcome: outcomeSkipped, err: skippedError},
			{row: "a3", outcome: outcomeSkipped, err: skippedError}},
		suspects: map[string]bool{"a1": false, "b1": false},
		sent:     true,
	}, {
		name:     "a failure on the last attempt is a failure the write makes dead",
		rows:     []claimedRow{withAttempt(planRow("a1", "A"), 10)},
		results:  []produceResult{failedWith(errRetriable)},
		want:     []planned{{row: "a1", outcome: outcomeFailed, err: "broker said no", delay: 10 * time.Second}},
		suspects: map[string]bool{"a1": false},
	}, {
		name:    "a Kafka outage defers without a delay of its own and holds back the key",
		rows:    []claimedRow{planRow("a1", "A"), planRow("a2", "A"), planRow("b1", "B")},
		results: []produceResult{failedWith(errOutage), failedWith(errOutage), failedWith(errOutage)},
		want: []planned{{row: "a1", outcome: outcomeDeferred, err: errorText(errOutage)},
			{row: "a2", outcome: outcomeSkipped, err: skippedError},
			{row: "b1", outcome: outcomeDeferred, err: errorText(errOutage)}},
		suspects: map[string]bool{"a1": false, "b1": false},
		outage:   true,
	}, {
		name:    "a row whose lease was lost is released and holds back its key",
		rows:    []claimedRow{planRow("a1", "A"), planRow("a2", "A"), planRow("b1", "B")},
		results: []produceResult{{leaseLost: true}, {leaseLost: true}, sentAt(0, 9)},
		want: []planned{{row: "a1", outcome: outcomeReleased},
			{row: "a2", outcome: outcomeSkipped, err: skippedError},
			{row: "b1", outcome: outcomeSent, off: 9}},
		suspects: map[string]bool{"b1": false},
		sent:     true,
	}, {
		name:     "rows without an outcome are released and hold back nothing",
		rows:     []claimedRow{planRow("a1", "A"), planRow("a2", "A")},
		results:  []produceResult{{}, {}},
		want:     []planned{{row: "a1", outcome: outcomeReleased}, {row: "a2", outcome: outcomeReleased}},
		suspects: map[string]bool{},
	}, {
		name:     "a produce cancelled at shutdown is released and holds back its key",
		rows:     []claimedRow{planRow("a1", "A"), planRow("a2", "A")},
		results:  []produceResult{failedWith(fmt.Errorf("produce: %w", context.Canceled)), {}},
		want:     []planned{{row: "a1", outcome: outcomeReleased}, {row: "a2", outcome: outcomeSkipped, err: skippedError}},
		suspects: map[string]bool{},
	}, {
		name: "a record refused in a shared request is a suspect, retried alone",
		rows: []claimedRow{planRow("a1", "A"), planRow("a2", "A"), planRow("b1", "B")},
		results: []produceResult{{done: true, err: kerr.MessageTooLarge, shared: true}, {done: true, err: kerr.MessageTooLarge, shared: true},
			failedWith(kerr.MessageTooLarge)},
		want: []planned{{row: "a1", outcome: outcomeFailed, err: errorText(kerr.MessageTooLarge), delay: time.Second},
			{row: "a2", outcome: outcomeSkipped, err: skippedError},
			{row: "b1", outcome: outcomeRejected, code: "message_too_large", err: errorText(kerr.MessageTooLarge)}},
		suspects: map[string]bool{"a1": true, "b1": false},
	}, {
		name:    "rows without a key are unordered",
		rows:    []claimedRow{planRow("n1", ""), planRow("n2", "")},
		results: []produceResult{failedWith(errRetriable), sentAt(0, 2)},
		want: []planned{{row: "n1", outcome: outcomeFailed, err: "broker said no", delay: time.Second},
			{row: "n2", outcome: outcomeSent, off: 2}},
		suspects: map[string]bool{"n1": false, "n2": false},
		sent:     true,
	}, {
		name:    "best effort holds back nothing",
		policy:  BestEffort,
		rows:    []claimedRow{planRow("a1", "A"), planRow("a2", "A")},
		results: []produceResult{failedWith(errRetriable), failedWith(errOutage)},
		want: []planned{{row: "a1", outcome: outcomeFailed, err: "broker said no", delay: time.Second},
			{row: "a2", outcome: outcomeDeferred, err: errorText(errOutage)}},
		suspects: map[string]bool{"a1": false, "a2": false},
		outage:   true,
	}, {
		name:    "per source, a failure holds back the source's other keys",
		policy:  PerSourceStream,
		rows:    []claimedRow{planRow("a1", "A"), planRow("b1", "B"), withSource(planRow("c1", "C"), "other")},
		results: []produceResult{failedWith(errRetriable), failedWith(errRetriable), sentAt(0, 4)},
		want: []planned{{row: "a1", outcome: outcomeFailed, err: "broker said no", delay: time.Second},
			{row: "b1", outcome: outcomeSkipped, err: skippedError},
			{row: "c1", outcome: outcomeSent, off: 4}},
		suspects: map[string]bool{"a1": false, "c1": false},
		sent:     true,
	}, {
		name:    "a row acknowledged after an earlier row of its key failed breaks the key's order",
		rows:    []claimedRow{planRow("a1", "A"), planRow("a2", "A")},
		results: []produceResult{failedWith(errRetriable), sentAt(2, 8)},
		want: []planned{{row: "a1", outcome: outcomeFailed, err: "broker said no", delay: time.Second},
			{row: "a2", outcome: outcomeSent, part: 2, off: 8}},
		orderBroken: []string{"a2"},
		suspects:    map[string]bool{"a1": false, "a2": false},
		sent:        true,
	}, {
		name:    "stop the line halts on the first failure",
		policy:  StopTheLine,
		rows:    []claimedRow{planRow("a1", "A"), planRow("b1", "B"), planRow("c1", "C")},
		results: []produceResult{sentAt(0, 1), failedWith(errRetriable), {}},
		want: []planned{{row: "a1", outcome: outcomeSent, off: 1},
			{row: "b1", outcome: outcomeFailed, err: "broker said no", delay: time.Second},
			{row: "c1", outcome: outcomeSkipped, err: skippedError}},
		halted:   "b1",
		suspects: map[string]bool{"a1": false, "b1": false},
		sent:     true,
	}, {
		name:    "stop the line halts on an outage",
		policy:  StopTheLine,
		rows:    []claimedRow{planRow("a1", "A"), planRow("b1", "B")},
		results: []produceResult{failedWith(errOutage), {}},
		want: []planned{{row: "a1", outcome: outcomeDeferred, err: errorText(errOutage)},
			{row: "b1", outcome: outcomeSkipped, err: skippedError}},
		halted:   "a1",
		suspects: map[string]bool{"a1": false},
		outage:   true,
	}, {
		name:    "stop the line does not halt on a rejection",
		policy:  StopTheLine,
		rows:    []claimedRow{planRow("a1", "A"), planRow("b1", "B")},
		results: []produceResult{failedWith(errRefusal), sentAt(0, 3)},
		want: []planned{{row: "a1", outcome: outcomeRejected, code: "topic_authorization_failed", err: errorText(errRefusal)},
			{row: "b1", outcome: outcomeSent, off: 3}},
		suspects: map[string]bool{"a1": false, "b1": false},
		sent:     true,
	}, {
		name:        "stop the line halts on a row that went dead in its claim",
		policy:      StopTheLine,
		rows:        []claimedRow{deadInClaim(withAttempt(planRow("a1", "A"), 3)), planRow("b1", "B")},
		results:     []produceResult{{}, {}},
		want:        []planned{{row: "b1", outcome: outcomeSkipped, err: skippedError}},
		halted:      "a1",
		deadOnClaim: map[string]int{"t1": 1},
		suspects:    map[string]bool{},
		reclaimed:   1,
	}, {
		name:        "a row that went dead in its claim is not marked and holds back nothing",
		rows:        []claimedRow{deadInClaim(withAttempt(planRow("a1", "A"), 3)), planRow("a2", "A")},
		results:     []produceResult{{}, sentAt(0, 6)},
		want:        []planned{{row: "a2", outcome: outcomeSent, off: 6}},
		deadOnClaim: map[string]int{"t1": 1},
		suspects:    map[string]bool{"a2": false},
		sent:        true,
		reclaimed:   1,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := planMarks(tc.rows, tc.results, tc.policy, retryDelay)
			name := map[envelope.UUID]string{}
			for _, r := range tc.rows {
				name[r.id] = r.event.MessageID
			}
			var got []planned
			for _, m := range p.marks {
				require.Equal(t, "t1", m.dest, "destination of %s", name[m.id])
				got = append(got, planned{row: name[m.id], outcome: m.outcome, err: m.err, code: m.code,
					delay: m.delay, part: m.partition, off: m.offset})
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, len(tc.rows), p.result.Claimed)
			require.Equal(t, tc.reclaimed, p.result.Reclaimed)
			if tc.halted == "" {
				require.Nil(t, p.result.HaltedOn)
			} else {
				require.NotNil(t, p.result.HaltedOn)
				var halted envelope.UUID
				copy(halted[:], tc.halted)
				require.Equal(t, halted.String(), *p.result.HaltedOn)
			}
			var broken []string
			for _, o := range p.orderBroken {
				broken = append(broken, o.row.event.MessageID)
			}
			require.Equal(t, tc.orderBroken, broken)
			require.Equal(t, len(tc.orderBroken), p.result.OrderBroken)
			if tc.deadOnClaim == nil {
				tc.deadOnClaim = map[string]int{}
			}
			require.Equal(t, tc.deadOnClaim, p.deadOnClaim)
			suspects := map[string]bool{}
			for id, s := range p.suspects {
				suspects[name[id]] = s
			}
			require.Equal(t, tc.suspects, suspects)
			require.Equal(t, tc.sent, p.sent, "sent")
			require.Equal(t, tc.outage, p.outage, "outage")
		})
	}
}

// TestPlanMarksOutageDelay: the relay's outage delay goes to the deferred rows only, and the
// claim loop is woken after the shortest delay of the rows going back to failed.
func TestPlanMarksOutageDelay(t *testing.T) {
	t.Parallel()
	rows := []claimedRow{withAttempt(planRow("a1", "A"), 5), planRow("b1", "B"), planRow("c1", "C"), planRow("d1", "D")}
	p := planMarks(rows, []produceResult{failedWith(errRetriable), failedWith(errOutage), sentAt(0, 1), {}}, PerKeyHeadOfLine, retryDelay)
	require.True(t, p.outage)
	require.Equal(t, 5*time.Second, p.retryIn(), "before the outage delay, only the failure's")
	p.deferFor(300 * time.Millisecond)
	var delays []time.Duration
	for _, m := range p.marks {
		delays = append(delays, m.delay)
	}
	require.Equal(t, []time.Duration{5 * time.Second, 300 * time.Millisecond, 0, 0}, delays)
	require.Equal(t, 300*time.Millisecond, p.retryIn())

	p = planMarks(rows[2:], []produceResult{sentAt(0, 1), {}}, PerKeyHeadOfLine, retryDelay)
	require.Zero(t, p.retryIn(), "no row goes back to failed")
}
