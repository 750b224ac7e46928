// Package testkafka starts an in-process Kafka cluster (franz-go's kfake, the real protocol on
// loopback) for tests, and connects clients to it.
package testkafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Cluster is a kfake cluster bound to loopback ports.
type Cluster struct {
	*kfake.Cluster
	// Brokers lists the listening addresses (host:port).
	Brokers []string
}

// New starts a single-broker kfake cluster that is closed when t ends. Extra options (for
// example kfake.SeedTopics or kfake.BrokerConfigs) are applied after the defaults.
func New(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	all := append([]kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation()}, opts...)
	c, err := kfake.NewCluster(all...)
	if err != nil {
		t.Fatalf("start kfake cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return &Cluster{Cluster: c, Brokers: c.ListenAddrs()}
}

// Client returns a franz-go client for the cluster, closed when t ends.
func (c *Cluster) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	all := append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		t.Fatalf("new kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// CreateTopic creates topic with the given partition count, failing t on error.
func (c *Cluster) CreateTopic(t testing.TB, topic string, partitions int32) {
	t.Helper()
	cl := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsgCreateTopics(topic, partitions)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	for _, tp := range resp.Topics {
		if tp.ErrorCode != 0 && tp.ErrorCode != 36 { // 36: TOPIC_ALREADY_EXISTS
			t.Fatalf("create topic %s: error code %d", topic, tp.ErrorCode)
		}
	}
}

// ConsumeAll reads every record of topics from the start until n records were read or the
// timeout passes, and returns them in fetch order.
func (c *Cluster) ConsumeAll(t testing.TB, n int, timeout time.Duration, topics ...string) []*kgo.Record {
	t.Helper()
	cl := c.Client(t, kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}
