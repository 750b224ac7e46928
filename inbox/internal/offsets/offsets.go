// Package offsets commits a consumer group member's offsets to Kafka, the commits of all its
// partitions gathered into one request at a time.
//
// franz-go runs one offset commit of a client at a time: a commit waits for the one in flight.
// A consumer whose partition workers each committed on their own waited, with N partitions, for
// up to N round trips in a row before its commit went out (measured with 32 partitions on a real
// broker: on average 24 of the 32 workers were waiting on a commit). A Committer sends what
// every partition asked for while a request was in flight as the next request, so a commit waits
// for at most the request in flight and its own.
package offsets

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Committer gathers offset commits into requests. Commit may be called from many goroutines. A
// request runs under a context of its own, until the latest deadline of the commits it carries
// (New's timeout for a caller without one), so a caller that gives up does not cancel the other
// partitions' commits in its request; a commit whose caller gave up before its request went out
// is not sent.
type Committer struct {
	base    context.Context
	timeout time.Duration

	mu      sync.Mutex
	queue   []*pending
	sending bool // a goroutine is sending the queue; it stops when the queue is empty

	// requests counts the commit requests sent (for tests).
	requests int
}

type pending struct {
	cl       *kgo.Client
	rec      *kgo.Record
	deadline time.Time  // the caller's; zero for none
	done     chan error // buffered: the sender never waits for a caller that gave up
}

type topicPartition struct {
	topic     string
	partition int32
}

// New returns a Committer whose requests run under base; timeout bounds a request that carries
// a commit without a deadline.
func New(base context.Context, timeout time.Duration) *Committer {
	return &Committer{base: base, timeout: timeout}
}

// Commit commits the offset after r (r.Offset+1, with r's leader epoch) for r's partition, on
// cl, the client of the group member that consumed r (one client for all the commits of a
// Committer). It returns nil once Kafka took it, the error for r's partition when Kafka refused
// it or the request failed, or ctx's error when ctx ends first: the commit is then not sent if
// its request had not gone out, and may still land if it had. A commit gathered with a later
// one of the same partition is answered by the later one's result, which covers it.
func (c *Committer) Commit(ctx context.Context, cl *kgo.Client, r *kgo.Record) error {
	p := &pending{cl: cl, rec: r, done: make(chan error, 1)}
	p.deadline, _ = ctx.Deadline()
	c.mu.Lock()
	c.queue = append(c.queue, p)
	start := !c.sending
	c.sending = true
	c.mu.Unlock()
	if start {
		go c.send()
	}
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		c.mu.Lock()
		c.queue = slices.DeleteFunc(c.queue, func(q *pending) bool { return q == p })
		c.mu.Unlock()
		return ctx.Err()
	}
}

// send sends the queue, one request after another, until it is empty.
func (c *Committer) send() {
	for {
		c.mu.Lock()
		batch := c.queue
		c.queue = nil
		if len(batch) == 0 {
			c.sending = false
			c.mu.Unlock()
			return
		}
		c.requests++
		c.mu.Unlock()
		c.commit(batch[0].cl, batch)
	}
}

// commit sends one request for batch's partitions (each at the highest offset asked for) and
// answers every commit in it.
func (c *Committer) commit(cl *kgo.Client, batch []*pending) {
	offsets := make(map[string]map[int32]kgo.EpochOffset)
	for _, p := range batch {
		parts := offsets[p.rec.Topic]
		if parts == nil {
			parts = make(map[int32]kgo.EpochOffset)
			offsets[p.rec.Topic] = parts
		}
		eo := kgo.EpochOffset{Epoch: p.rec.LeaderEpoch, Offset: p.rec.Offset + 1}
		if at, ok := parts[p.rec.Partition]; ok && eo.Less(at) {
			continue
		}
		parts[p.rec.Partition] = eo
	}
	var deadline time.Time
	for _, p := range batch {
		d := p.deadline
		if d.IsZero() {
			d = time.Now().Add(c.timeout)
		}
		if d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(c.base, deadline)
	defer cancel()
	var reqErr error
	answered := make(map[topicPartition]error)
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			reqErr = err
			return
		}
		// From version 10 on, Kafka may name a topic by its id alone.
		names := make(map[[16]byte]string, len(req.Topics))
		for _, t := range req.Topics {
			names[t.TopicID] = t.Topic
		}
		for _, t := range resp.Topics {
			topic := t.Topic
			if topic == "" {
				topic = names[t.TopicID]
			}
			for _, p := range t.Partitions {
				answered[topicPartition{topic, p.Partition}] = kerr.ErrorForCode(p.ErrorCode)
			}
		}
	})
	for _, p := range batch {
		err := reqErr
		if err == nil {
			var ok bool
			if err, ok = answered[topicPartition{p.rec.Topic, p.rec.Partition}]; !ok {
				err = fmt.Errorf("commit offset of %s/%d: %w", p.rec.Topic, p.rec.Partition, errUnanswered)
			}
		}
		p.done <- err
	}
}

// errUnanswered is a partition's commit the response left out.
var errUnanswered = errors.New("the commit response does not answer for the partition")
