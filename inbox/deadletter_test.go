package inbox_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/internal/testdb"
	"github.com/keiro-go/keiro/internal/testkafka"
)

// failProduces makes the broker refuse every produce request from now on (requests name topics
// by id in recent versions, so the hook cannot pick by name); it returns the number of
// requests refused so far.
func failProduces(kc *testkafka.Cluster) *atomic.Int64 {
	var refused atomic.Int64
	kc.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		refused.Add(1)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			t := kmsg.NewProduceResponseTopic()
			t.Topic, t.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				p := kmsg.NewProduceResponseTopicPartition()
				p.Partition, p.ErrorCode, p.BaseOffset = rp.Partition, kerr.TopicAuthorizationFailed.Code, -1
				t.Partitions = append(t.Partitions, p)
			}
			resp.Topics = append(resp.Topics, t)
		}
		return resp, nil, true
	})
	return &refused
}

// TestConsumerStoppedWhileDeadLetteringCommitsOnlyWhatRan: in batch mode, a good record is
// followed by an undecodable one whose dead-letter produce keeps failing. When the consumer is
// stopped meanwhile, the committed offset must not pass a record whose effects did not run:
// the good record is processed before the bad one is dead-lettered (in offset order), and the
// bad one is not committed.
func TestConsumerStoppedWhileDeadLetteringCommitsOnlyWhatRan(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	fx := newEffects(t, db)
	kc := testkafka.New(t)
	const topic = "billing.stuck-dlq.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	prod := kc.Client(t)
	good := newEvent("ordering", topic)
	produceEvents(t, prod, good)
	produce(t, prod, &kgo.Record{Topic: topic, Value: []byte("garbage, no headers")})
	refused := failProduces(kc) // the consumer's dead-letter produces

	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Brokers, Group: "billing", Topics: []string{topic}, BatchSize: 2,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}, fx.handler())
	deadline := time.Now().Add(30 * time.Second)
	for refused.Load() < 2 {
		require.True(t, time.Now().Before(deadline), "the dead-letter produce was never tried")
		time.Sleep(10 * time.Millisecond)
	}
	r.stop(t)

	require.Equal(t, 1, fx.count(t, good.MessageID), "the good record ran")
	require.EqualValues(t, 1, p.total(topic), "committed up to the good record, not past the bad one")
	require.Zero(t, r.c.Stats().DeadLettered)
}
