package offsets

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

const (
	topic = "billing.offsets.v1"
	group = "billing"
	parts = 8
)

// joined returns a Kafka with topic and a client that has joined group there and been assigned
// topic's partitions.
func joined(t *testing.T) (*testenv.Kafka, *kgo.Client) {
	t.Helper()
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, topic, parts)
	assigned := make(chan struct{})
	var once sync.Once
	cl := kc.NewClient(t, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { once.Do(func() { close(assigned) }) }))
	ctx, cancel := context.WithCancel(context.Background())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	}()
	t.Cleanup(func() { cancel(); <-polled })
	select {
	case <-assigned:
	case <-time.After(30 * time.Second):
		t.Fatal("the member was not assigned its partitions")
	}
	return kc, cl
}

// inFlight commits r and returns once its request reached Kafka, which holds it (hold).
func inFlight(c *Committer, cl *kgo.Client, h *held, r *kgo.Record) <-chan map[int32]error {
	res := commitAll(c, cl, r)
	<-h.first
	return res
}

// held holds the group's first offset commit request until release is closed, and records
// the partitions of every request, in order.
type held struct {
	mu       sync.Mutex
	requests [][]int32
	first    chan struct{} // closed when the first request arrived
	release  chan struct{}
}

// answer makes the response to a commit request in place of Kafka (which then does not see
// it); nil lets Kafka answer.
type answer func(*kmsg.OffsetCommitRequest) *kmsg.OffsetCommitResponse

// refusing answers each partition with its code in refuse (0, taken, for the others).
func refusing(refuse map[int32]int16) answer {
	return func(req *kmsg.OffsetCommitRequest) *kmsg.OffsetCommitResponse {
		resp := testenv.OffsetCommitError(req, 0)
		for i := range resp.Topics {
			for j := range resp.Topics[i].Partitions {
				resp.Topics[i].Partitions[j].ErrorCode = refuse[resp.Topics[i].Partitions[j].Partition]
			}
		}
		return resp
	}
}

func hold(kc *testenv.Kafka, answer answer) *held {
	h := &held{first: make(chan struct{}), release: make(chan struct{})}
	kc.Cluster.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		if req.Group != group {
			return nil, nil, false
		}
		var ps []int32
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				ps = append(ps, rp.Partition)
			}
		}
		h.mu.Lock()
		h.requests = append(h.requests, ps)
		n := len(h.requests)
		h.mu.Unlock()
		if n == 1 {
			close(h.first)
			<-h.release
		}
		if answer == nil {
			return nil, nil, false
		}
		return answer(req), nil, true
	})
	return h
}

func (c *Committer) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// commitAll commits recs from a goroutine each and returns their results by partition.
func commitAll(c *Committer, cl *kgo.Client, recs ...*kgo.Record) <-chan map[int32]error {
	out := make(chan map[int32]error, 1)
	var mu sync.Mutex
	res := map[int32]error{}
	var wg sync.WaitGroup
	for _, r := range recs {
		wg.Go(func() {
			err := c.Commit(context.Background(), cl, r)
			mu.Lock()
			defer mu.Unlock()
			res[r.Partition] = err
		})
	}
	go func() { wg.Wait(); out <- res }()
	return out
}

func rec(partition int32, offset int64) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: partition, Offset: offset, LeaderEpoch: -1}
}

// TestCommitterGathersWhatWaitedIntoOneRequest: while one partition's commit is in flight, the
// other seven ask for theirs; they go out together as the next request, each caller gets its
// partition's answer, and the group's offsets are where they were asked to be.
func TestCommitterGathersWhatWaitedIntoOneRequest(t *testing.T) {
	t.Parallel()
	kc, cl := joined(t)
	h := hold(kc, nil)
	c := New(context.Background(), 30*time.Second)

	first := inFlight(c, cl, h, rec(0, 9))
	var rest []*kgo.Record
	for p := int32(1); p < parts; p++ {
		rest = append(rest, rec(p, int64(10*p+9)))
	}
	others := commitAll(c, cl, rest...)
	require.Eventually(t, func() bool { return c.queued() == parts-1 }, 30*time.Second, time.Millisecond,
		"the seven commits wait behind the first")
	close(h.release)

	require.Equal(t, map[int32]error{0: nil}, <-first)
	got := <-others
	require.Len(t, got, parts-1)
	for p, err := range got {
		require.NoError(t, err, "partition %d", p)
	}
	h.mu.Lock()
	require.Len(t, h.requests, 2, "one request in flight, then one for all that waited: %v", h.requests)
	require.ElementsMatch(t, []int32{1, 2, 3, 4, 5, 6, 7}, h.requests[1])
	h.mu.Unlock()
	require.Equal(t, 2, c.requests)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(kc.NewClient(t)).FetchOffsets(ctx, group)
	require.NoError(t, err)
	for p := int32(0); p < parts; p++ {
		o, ok := offs.Lookup(topic, p)
		require.True(t, ok, "partition %d", p)
		require.EqualValues(t, 10*p+10, o.At, "partition %d", p)
	}
}

// TestCommitterAnswersEachPartition: Kafka refuses one partition of a request; only that
// partition's caller gets the error. Two commits of one partition in one request go out once, as
// the later offset, and both callers get its answer.
func TestCommitterAnswersEachPartition(t *testing.T) {
	t.Parallel()
	kc, cl := joined(t)
	h := hold(kc, refusing(map[int32]int16{2: kerr.OffsetMetadataTooLarge.Code}))
	c := New(context.Background(), 30*time.Second)

	first := inFlight(c, cl, h, rec(0, 4))
	refused := commitAll(c, cl, rec(2, 4))
	earlier := commitAll(c, cl, rec(1, 3))
	later := commitAll(c, cl, rec(1, 7))
	require.Eventually(t, func() bool { return c.queued() == 3 }, 30*time.Second, time.Millisecond)
	close(h.release)

	require.Equal(t, map[int32]error{0: nil}, <-first)
	require.ErrorIs(t, (<-refused)[2], kerr.OffsetMetadataTooLarge)
	require.Equal(t, map[int32]error{1: nil}, <-earlier)
	require.Equal(t, map[int32]error{1: nil}, <-later)
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Len(t, h.requests, 2, "%v", h.requests)
	require.ElementsMatch(t, []int32{1, 2}, h.requests[1], "partition 1 once")
}

// TestCommitterCallerGivesUp: a caller whose context ends while its commit waits gets its error
// at once, and its commit is not sent; the others' go out.
func TestCommitterCallerGivesUp(t *testing.T) {
	t.Parallel()
	kc, cl := joined(t)
	h := hold(kc, nil)
	c := New(context.Background(), 30*time.Second)

	first := inFlight(c, cl, h, rec(0, 4))
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- c.Commit(ctx, cl, rec(1, 4)) }()
	stays := commitAll(c, cl, rec(2, 4))
	require.Eventually(t, func() bool { return c.queued() == 2 }, 30*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-gaveUp, context.Canceled)
	require.Equal(t, 1, c.queued(), "the commit given up left the queue")
	close(h.release)
	require.Equal(t, map[int32]error{0: nil}, <-first)
	require.Equal(t, map[int32]error{2: nil}, <-stays)
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, [][]int32{{0}, {2}}, h.requests)
}

// TestCommitterRequestEndsAtItsCallersDeadline: a request whose callers' deadlines passed is
// given up (the fault holds Kafka's answer), not kept for New's timeout.
func TestCommitterRequestEndsAtItsCallersDeadline(t *testing.T) {
	t.Parallel()
	kc, cl := joined(t)
	h := hold(kc, nil)
	defer close(h.release)
	c := New(context.Background(), time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Commit(ctx, cl, rec(0, 4)), context.DeadlineExceeded)
	// The sender gives the request up at the same deadline and stops: a new commit starts a
	// new sender and request.
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return !c.sending
	}, 30*time.Second, time.Millisecond, "the request outlived its only caller's deadline")
}

// TestCommitterOddResponses: responses nobody chose (a partition left out, an error code no
// Kafka version has, topics named by id alone, nothing at all, a topic nobody asked for) end
// as a clear error for the partitions they leave unanswered, and the partition answered in the
// same response still goes through.
func TestCommitterOddResponses(t *testing.T) {
	t.Parallel()
	odd := func(edit func(resp *kmsg.OffsetCommitResponse)) answer {
		return func(req *kmsg.OffsetCommitRequest) *kmsg.OffsetCommitResponse {
			resp := refusing(nil)(req)
			edit(resp)
			return resp
		}
	}
	eachPartition := func(resp *kmsg.OffsetCommitResponse, f func(*kmsg.OffsetCommitResponseTopicPartition)) {
		for i := range resp.Topics {
			for j := range resp.Topics[i].Partitions {
				f(&resp.Topics[i].Partitions[j])
			}
		}
	}
	for _, tc := range []struct {
		name   string
		answer answer
		p1     func(t *testing.T, err error) // partition 1's result; partition 0's is nil unless said
		p0     func(t *testing.T, err error)
	}{
		{"partition left out", odd(func(resp *kmsg.OffsetCommitResponse) {
			for i := range resp.Topics {
				resp.Topics[i].Partitions = slices.DeleteFunc(resp.Topics[i].Partitions,
					func(p kmsg.OffsetCommitResponseTopicPartition) bool { return p.Partition == 1 })
			}
		}), func(t *testing.T, err error) { require.ErrorIs(t, err, errUnanswered) }, nil},
		{"unknown error code", odd(func(resp *kmsg.OffsetCommitResponse) {
			eachPartition(resp, func(p *kmsg.OffsetCommitResponseTopicPartition) {
				if p.Partition == 1 {
					p.ErrorCode = 32767
				}
			})
		}), func(t *testing.T, err error) { require.Error(t, err) }, nil},
		{"topics named by id alone", odd(func(resp *kmsg.OffsetCommitResponse) {
			for i := range resp.Topics {
				resp.Topics[i].Topic = ""
			}
		}), func(t *testing.T, err error) { require.NoError(t, err) }, nil},
		{"a topic nobody asked for", odd(func(resp *kmsg.OffsetCommitResponse) {
			extra := kmsg.NewOffsetCommitResponseTopic()
			extra.Topic = "\x00\xffunknown"
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition, rp.ErrorCode = 1, kerr.UnknownTopicOrPartition.Code
			extra.Partitions = append(extra.Partitions, rp)
			resp.Topics = append(resp.Topics, extra)
		}), func(t *testing.T, err error) { require.NoError(t, err) }, nil},
		{"nothing at all", odd(func(resp *kmsg.OffsetCommitResponse) { resp.Topics = nil }),
			func(t *testing.T, err error) { require.ErrorIs(t, err, errUnanswered) },
			func(t *testing.T, err error) { require.ErrorIs(t, err, errUnanswered) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kc, cl := joined(t)
			h := hold(kc, tc.answer)
			c := New(context.Background(), 30*time.Second)
			inFlight(c, cl, h, rec(3, 4))
			both := commitAll(c, cl, rec(0, 4), rec(1, 4))
			require.Eventually(t, func() bool { return c.queued() == 2 }, 30*time.Second, time.Millisecond)
			close(h.release)
			got := <-both
			tc.p1(t, got[1])
			if tc.p0 != nil {
				tc.p0(t, got[0])
			} else {
				require.NoError(t, got[0])
			}
		})
	}
}
