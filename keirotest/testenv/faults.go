package testenv

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ProduceFailure describes produce requests the embedded broker refuses, for Kafka.FailProduces.
type ProduceFailure struct {
	// Topics limits the failure to produce requests that carry a record for one of these
	// topics (FailProduces creates those that do not exist yet); a request is answered as a
	// whole, so its other topics fail with it. Defaults to every topic.
	Topics []string
	// Err is the error every partition of a refused request is answered with. A retriable
	// error (the default) looks like an outage to a producer: the relay retries it without
	// using attempts. A non-retriable one such as kerr.MessageTooLarge makes the relay reject
	// the rows. Defaults to kerr.NotLeaderForPartition.
	Err *kerr.Error
	// Requests ends the failure by itself after this many refused requests. Defaults to 0
	// (no limit).
	Requests int
	// For ends the failure by itself after this long. Defaults to 0 (no limit).
	For time.Duration
}

// Outage is a produce failure in progress. Its methods are safe for concurrent use.
type Outage struct {
	k     *Kafka
	f     ProduceFailure
	mu    sync.Mutex
	ids   map[[16]byte]bool // of f.Topics: recent produce requests name topics by id
	ended bool
	n     int
	hit   chan struct{}
	timer *time.Timer
}

// FailProduces makes the embedded broker refuse produce requests as f describes, from now
// until Outage.End, the limits of f, or the end of t, whichever comes first. Requests it does
// not refuse are handled normally. Use it to test what a service does while Kafka is down.
//
// After a retriable error, franz-go waits for a metadata refresh (kgo.MetadataMinAge, 5s by
// default) before it retries; build the clients under test with FastRetries so that they
// recover in milliseconds, as Kafka.NewClient and DrainOutbox do.
//
//	outage := kafka.FailProduces(t, keirotest.ProduceFailure{})
//	// ... enqueue, run the relay ...
//	<-outage.Hit() // a produce was refused
//	outage.End()
func (k *Kafka) FailProduces(t testing.TB, f ProduceFailure) *Outage {
	t.Helper()
	if k.Cluster == nil {
		t.Fatal("keirotest.FailProduces: produce failures are injected by the embedded broker; a real broker (NewRealKafka) has no hook for them")
	}
	if f.Err == nil {
		f.Err = kerr.NotLeaderForPartition
	}
	if f.Requests < 0 || f.For < 0 {
		t.Fatalf("keirotest.FailProduces: ProduceFailure.Requests and For must not be negative, got %d and %s",
			f.Requests, f.For)
	}
	o := &Outage{k: k, f: f, hit: make(chan struct{}), ids: k.topicIDs(t, f.Topics)}
	if f.For > 0 {
		o.timer = time.AfterFunc(f.For, o.End)
	}
	t.Cleanup(o.End)
	k.Cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		if !o.refuse(req) {
			return nil, nil, false
		}
		k.Cluster.KeepControl()
		return ProduceError(req, f.Err.Code), nil, true
	})
	return o
}

// refuse decides whether req fails and counts it; once the outage ended it also drops the
// control function.
func (o *Outage) refuse(req *kmsg.ProduceRequest) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended {
		o.k.Cluster.DropControl()
		return false
	}
	if len(o.f.Topics) > 0 && !slices.ContainsFunc(req.Topics, func(rt kmsg.ProduceRequestTopic) bool {
		return slices.Contains(o.f.Topics, rt.Topic) || o.ids[rt.TopicID]
	}) {
		o.k.Cluster.KeepControl()
		return false
	}
	o.n++
	if o.n == 1 {
		close(o.hit)
	}
	if o.f.Requests > 0 && o.n >= o.f.Requests {
		o.endLocked()
	}
	return true
}

// End stops refusing produce requests; requests after it are handled normally. Calling it
// again does nothing.
func (o *Outage) End() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.endLocked()
}

func (o *Outage) endLocked() {
	o.ended = true
	if o.timer != nil {
		o.timer.Stop()
	}
}

// Refused returns how many produce requests were refused so far.
func (o *Outage) Refused() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// Hit returns a channel closed when the first produce request is refused: wait on it, rather
// than sleep, to know that the producer under test met the outage.
func (o *Outage) Hit() <-chan struct{} { return o.hit }

// Ended reports whether the outage is over.
func (o *Outage) Ended() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ended
}

// topicIDs creates the topics that do not exist yet and returns their ids.
func (k *Kafka) topicIDs(t testing.TB, topics []string) map[[16]byte]bool {
	t.Helper()
	if len(topics) == 0 {
		return nil
	}
	for _, topic := range topics {
		k.CreateTopic(t, topic, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	details, err := kadm.NewClient(k.Client).ListTopics(ctx, topics...)
	if err == nil {
		err = details.Error()
	}
	if err != nil {
		t.Fatalf("keirotest.FailProduces: look up the topics to fail: %v", err)
	}
	ids := map[[16]byte]bool{}
	for _, d := range details {
		ids[d.ID] = true
	}
	return ids
}

// ProduceError answers every partition of a produce request with code: the response a
// control hook (kfake's ControlKey) returns to fail the request.
func ProduceError(req *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	resp.Version = req.Version
	for _, t := range req.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition, rp.ErrorCode, rp.BaseOffset = p.Partition, code, -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// OffsetCommitError is the broker's answer to req that refuses every partition's commit with
// code, for a kfake control function that fails offset commits.
func OffsetCommitError(req *kmsg.OffsetCommitRequest, code int16) *kmsg.OffsetCommitResponse {
	resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
	resp.Version = req.Version
	for _, t := range req.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}
