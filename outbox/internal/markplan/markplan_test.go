package markplan

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
)

// The rows of the plans below, on their first attempt: perKey is a row of key under the
// per-key policies (its group is its key), inSource a row of key under PerSourceStream (its
// group is its source), noKey a row without a key, lineRow a row under StopTheLine (one group
// for every row) and bestEffort a row under BestEffort (a group of its own).
func perKey(key string) Row               { return Row{Group: key, Key: key, Attempt: 1} }
func inSource(source, key string) Row     { return Row{Group: source, Key: key, Attempt: 1} }
func noKey() Row                          { return Row{Attempt: 1} }
func lineRow(key string) Row              { return Row{Group: "all", Key: key, Attempt: 1} }
func bestEffort(key string) Row           { return Row{Key: key, Attempt: 1} }
func onAttempt(r Row, n int) Row          { r.Attempt = n; return r }
func deadInClaim(r Row) Row               { r.Dead, r.Reclaimed = true, true; return r }
func sentAt(part int32, off int64) Result { return Result{Done: true, Partition: part, Offset: off} }
func failedWith(err error) Result         { return Result{Done: true, Err: err} }

// The produce errors of the plans below: retried, a Kafka outage, refused for good.
var (
	errRetriable = errors.New("broker said no")
	errOutage    = kerr.NotLeaderForPartition
	errRefusal   = kerr.TopicAuthorizationFailed
)

// retryDelay is a backoff without jitter, so the plans' delays are exact: the attempt in
// seconds.
func retryDelay(attempt int) time.Duration { return time.Duration(attempt) * time.Second }

// TestDecide: each produce result gives its row's outcome, a failure holds back the later rows
// of its group and halts StopTheLine, and the plan reports what the relay logs and counts
// beside the write.
func TestDecide(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		stopTheLine bool
		rows        []Row
		results     []Result
		want        []Mark
		halted      int // -1 for none
		orderBroken []int
		dead        []int
		suspects    map[int]bool
		sent        bool
		outage      bool
		reclaimed   int
	}{{
		name:    "acknowledged rows are sent",
		rows:    []Row{perKey("A"), perKey("B")},
		results: []Result{sentAt(3, 70), sentAt(1, 12)},
		want: []Mark{{Row: 0, Outcome: Sent, Partition: 3, Offset: 70},
			{Row: 1, Outcome: Sent, Partition: 1, Offset: 12}},
		halted:   -1,
		suspects: map[int]bool{0: false, 1: false},
		sent:     true,
	}, {
		name:    "a row too large is rejected before its produce and holds back nothing",
		rows:    []Row{perKey("A"), perKey("A")},
		results: []Result{{RejectMsg: "record of 2 MiB exceeds 1 MiB"}, sentAt(0, 1)},
		want: []Mark{{Row: 0, Outcome: Rejected, Code: "message_too_large", Err: "record of 2 MiB exceeds 1 MiB"},
			{Row: 1, Outcome: Sent, Offset: 1}},
		halted:   -1,
		suspects: map[int]bool{1: false},
		sent:     true,
	}, {
		name:    "a refusal for good is rejected with its code and holds back nothing",
		rows:    []Row{perKey("A"), perKey("A")},
		results: []Result{failedWith(errRefusal), sentAt(0, 1)},
		want: []Mark{{Row: 0, Outcome: Rejected, Code: "topic_authorization_failed", Err: ErrorText(errRefusal)},
			{Row: 1, Outcome: Sent, Offset: 1}},
		halted:   -1,
		suspects: map[int]bool{0: false, 1: false},
		sent:     true,
	}, {
		name:    "a retriable failure is retried after its attempt's backoff and holds back its key",
		rows:    []Row{onAttempt(perKey("A"), 2), perKey("B"), perKey("A"), perKey("A")},
		results: []Result{failedWith(errRetriable), sentAt(0, 5), failedWith(errRetriable), {}},
		want: []Mark{{Row: 0, Outcome: Failed, Err: "broker said no", Delay: 2 * time.Second},
			{Row: 1, Outcome: Sent, Offset: 5},
			{Row: 2, Outcome: Skipped, Err: SkippedError},
			{Row: 3, Outcome: Skipped, Err: SkippedError}},
		halted:   -1,
		suspects: map[int]bool{0: false, 1: false},
		sent:     true,
	}, {
		name:     "a failure on the last attempt is a failure, which the write makes dead",
		rows:     []Row{onAttempt(perKey("A"), 10)},
		results:  []Result{failedWith(errRetriable)},
		want:     []Mark{{Row: 0, Outcome: Failed, Err: "broker said no", Delay: 10 * time.Second}},
		halted:   -1,
		suspects: map[int]bool{0: false},
	}, {
		name:    "a Kafka outage defers, without a delay of its own, and holds back the key",
		rows:    []Row{perKey("A"), perKey("A"), perKey("B")},
		results: []Result{failedWith(errOutage), failedWith(errOutage), failedWith(errOutage)},
		want: []Mark{{Row: 0, Outcome: Deferred, Err: ErrorText(errOutage)},
			{Row: 1, Outcome: Skipped, Err: SkippedError},
			{Row: 2, Outcome: Deferred, Err: ErrorText(errOutage)}},
		halted:   -1,
		suspects: map[int]bool{0: false, 2: false},
		outage:   true,
	}, {
		name:    "a row whose lease was lost is released and holds back its key",
		rows:    []Row{perKey("A"), perKey("A"), perKey("B")},
		results: []Result{{LeaseLost: true}, {LeaseLost: true}, sentAt(0, 9)},
		want: []Mark{{Row: 0, Outcome: Released},
			{Row: 1, Outcome: Skipped, Err: SkippedError},
			{Row: 2, Outcome: Sent, Offset: 9}},
		halted:   -1,
		suspects: map[int]bool{2: false},
		sent:     true,
	}, {
		name:     "rows without an outcome are released and hold back nothing",
		rows:     []Row{perKey("A"), perKey("A")},
		results:  []Result{{}, {}},
		want:     []Mark{{Row: 0, Outcome: Released}, {Row: 1, Outcome: Released}},
		halted:   -1,
		suspects: map[int]bool{},
	}, {
		name:     "a produce cancelled at shutdown is released and holds back its key",
		rows:     []Row{perKey("A"), perKey("A")},
		results:  []Result{failedWith(fmt.Errorf("produce: %w", context.Canceled)), {}},
		want:     []Mark{{Row: 0, Outcome: Released}, {Row: 1, Outcome: Skipped, Err: SkippedError}},
		halted:   -1,
		suspects: map[int]bool{},
	}, {
		name: "a record refused in a shared request is a suspect, retried alone; alone, it is rejected",
		rows: []Row{perKey("A"), perKey("A"), perKey("B")},
		results: []Result{{Done: true, Err: kerr.MessageTooLarge, Shared: true}, {Done: true, Err: kerr.MessageTooLarge, Shared: true},
			failedWith(kerr.MessageTooLarge)},
		want: []Mark{{Row: 0, Outcome: Failed, Err: ErrorText(kerr.MessageTooLarge), Delay: time.Second},
			{Row: 1, Outcome: Skipped, Err: SkippedError},
			{Row: 2, Outcome: Rejected, Code: "message_too_large", Err: ErrorText(kerr.MessageTooLarge)}},
		halted:   -1,
		suspects: map[int]bool{0: true, 2: false},
	}, {
		name:    "rows without a key are unordered",
		rows:    []Row{noKey(), noKey()},
		results: []Result{failedWith(errRetriable), sentAt(0, 2)},
		want: []Mark{{Row: 0, Outcome: Failed, Err: "broker said no", Delay: time.Second},
			{Row: 1, Outcome: Sent, Offset: 2}},
		halted:   -1,
		suspects: map[int]bool{0: false, 1: false},
		sent:     true,
	}, {
		name:    "best effort holds back nothing",
		rows:    []Row{bestEffort("A"), bestEffort("A")},
		results: []Result{failedWith(errRetriable), failedWith(errOutage)},
		want: []Mark{{Row: 0, Outcome: Failed, Err: "broker said no", Delay: time.Second},
			{Row: 1, Outcome: Deferred, Err: ErrorText(errOutage)}},
		halted:   -1,
		suspects: map[int]bool{0: false, 1: false},
		outage:   true,
	}, {
		name:    "per source, a failure holds back the source's other keys",
		rows:    []Row{inSource("s", "A"), inSource("s", "B"), inSource("other", "C")},
		results: []Result{failedWith(errRetriable), failedWith(errRetriable), sentAt(0, 4)},
		want: []Mark{{Row: 0, Outcome: Failed, Err: "broker said no", Delay: time.Second},
			{Row: 1, Outcome: Skipped, Err: SkippedError},
			{Row: 2, Outcome: Sent, Offset: 4}},
		halted:   -1,
		suspects: map[int]bool{0: false, 2: false},
		sent:     true,
	}, {
		name:    "a row acknowledged after an earlier row of its key failed breaks the key's order",
		rows:    []Row{perKey("A"), perKey("A")},
		results: []Result{failedWith(errRetriable), sentAt(2, 8)},
		want: []Mark{{Row: 0, Outcome: Failed, Err: "broker said no", Delay: time.Second},
			{Row: 1, Outcome: Sent, Partition: 2, Offset: 8}},
		halted:      -1,
		orderBroken: []int{1},
		suspects:    map[int]bool{0: false, 1: false},
		sent:        true,
	}, {
		name:        "stop the line halts on the first failure",
		stopTheLine: true,
		rows:        []Row{lineRow("A"), lineRow("B"), lineRow("C")},
		results:     []Result{sentAt(0, 1), failedWith(errRetriable), {}},
		want: []Mark{{Row: 0, Outcome: Sent, Offset: 1},
			{Row: 1, Outcome: Failed, Err: "broker said no", Delay: time.Second},
			{Row: 2, Outcome: Skipped, Err: SkippedError}},
		halted:   1,
		suspects: map[int]bool{0: false, 1: false},
		sent:     true,
	}, {
		name:        "stop the line halts on an outage",
		stopTheLine: true,
		rows:        []Row{lineRow("A"), lineRow("B")},
		results:     []Result{failedWith(errOutage), {}},
		want: []Mark{{Row: 0, Outcome: Deferred, Err: ErrorText(errOutage)},
			{Row: 1, Outcome: Skipped, Err: SkippedError}},
		halted:   0,
		suspects: map[int]bool{0: false},
		outage:   true,
	}, {
		name:        "stop the line does not halt on a rejection",
		stopTheLine: true,
		rows:        []Row{lineRow("A"), lineRow("B")},
		results:     []Result{failedWith(errRefusal), sentAt(0, 3)},
		want: []Mark{{Row: 0, Outcome: Rejected, Code: "topic_authorization_failed", Err: ErrorText(errRefusal)},
			{Row: 1, Outcome: Sent, Offset: 3}},
		halted:   -1,
		suspects: map[int]bool{0: false, 1: false},
		sent:     true,
	}, {
		name:        "stop the line halts on a row that went dead in its claim",
		stopTheLine: true,
		rows:        []Row{deadInClaim(onAttempt(lineRow("A"), 3)), lineRow("B")},
		results:     []Result{{}, {}},
		want:        []Mark{{Row: 1, Outcome: Skipped, Err: SkippedError}},
		halted:      0,
		dead:        []int{0},
		suspects:    map[int]bool{},
		reclaimed:   1,
	}, {
		name:      "a row that went dead in its claim is not marked and holds back nothing",
		rows:      []Row{deadInClaim(onAttempt(perKey("A"), 3)), perKey("A")},
		results:   []Result{{}, sentAt(0, 6)},
		want:      []Mark{{Row: 1, Outcome: Sent, Offset: 6}},
		halted:    -1,
		dead:      []int{0},
		suspects:  map[int]bool{1: false},
		sent:      true,
		reclaimed: 1,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := Decide(tc.rows, tc.results, tc.stopTheLine, retryDelay)
			require.Equal(t, tc.want, p.Marks)
			require.Equal(t, tc.halted, p.HaltedOn, "halted on")
			require.Equal(t, tc.orderBroken, p.OrderBroken, "order broken")
			require.Equal(t, tc.dead, p.Dead, "dead in the claim")
			require.Equal(t, tc.reclaimed, p.Reclaimed, "reclaimed")
			require.Equal(t, tc.suspects, p.Suspects, "suspects")
			require.Equal(t, tc.sent, p.Sent, "sent")
			require.Equal(t, tc.outage, p.Outage, "outage")
		})
	}
}

// TestDeferFor: the relay's outage delay goes to the deferred rows only, and the relay claims
// again after the shortest delay of the rows going back to failed.
func TestDeferFor(t *testing.T) {
	t.Parallel()
	rows := []Row{onAttempt(perKey("A"), 5), perKey("B"), perKey("C"), perKey("D")}
	p := Decide(rows, []Result{failedWith(errRetriable), failedWith(errOutage), sentAt(0, 1), {}}, false, retryDelay)
	require.True(t, p.Outage)
	require.Equal(t, 5*time.Second, p.RetryIn(), "before the outage delay, only the failure's")
	p.DeferFor(300 * time.Millisecond)
	var delays []time.Duration
	for _, m := range p.Marks {
		delays = append(delays, m.Delay)
	}
	require.Equal(t, []time.Duration{5 * time.Second, 300 * time.Millisecond, 0, 0}, delays)
	require.Equal(t, 300*time.Millisecond, p.RetryIn())

	p = Decide(rows[2:], []Result{sentAt(0, 1), {}}, false, retryDelay)
	require.Zero(t, p.RetryIn(), "no row goes back to failed")
}

// TestOutcomeNames: the names the mark statement reads.
func TestOutcomeNames(t *testing.T) {
	t.Parallel()
	var names []string
	for _, o := range []Outcome{Sent, Failed, Skipped, Released, Rejected, Deferred} {
		names = append(names, o.String())
	}
	require.Equal(t, []string{"sent", "failed", "skipped", "released", "rejected", "deferred"}, names)
}
