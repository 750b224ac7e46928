// Package testkafka starts an in-process Kafka cluster (franz-go's kfake, the real protocol on
// loopback) for tests, and connects clients to it. It is a thin layer over the public test kit
// (keirotest/testenv, re-exported by keirotest), which users' tests use the same way.
package testkafka

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// Cluster is a kfake cluster bound to loopback ports, or a namespace on a real Apache Kafka
// broker (NewReal; its kfake.Cluster is then nil).
type Cluster struct {
	*kfake.Cluster
	// Brokers lists the listening addresses (host:port).
	Brokers []string
	kit     *testenv.Kafka
}

// autoCreatePartitions is kfake's own default partition count, which topics created on first
// use keep here (the kit defaults to one).
const autoCreatePartitions = 10

// New starts a single-broker kfake cluster that is closed when t ends. Extra options (for
// example kfake.SeedTopics or kfake.BrokerConfigs) are applied after the defaults.
func New(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	k := testenv.NewKafkaWith(t, testenv.KafkaConfig{Partitions: autoCreatePartitions, ClusterOpts: opts})
	return &Cluster{Cluster: k.Cluster, Brokers: k.Seeds, kit: k}
}

// NewReal is New on the real Apache Kafka broker of the test kit (testenv.NewRealKafka): name
// the test's topics and groups through Topic and Group.
func NewReal(t testing.TB) *Cluster {
	t.Helper()
	k := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true, Partitions: autoCreatePartitions})
	return &Cluster{Brokers: k.Seeds, kit: k}
}

// BenchEnv names the environment variable that runs the benchmarks on a real broker
// (testenv.BenchKafkaEnv).
const BenchEnv = testenv.BenchKafkaEnv

// ForBench is the broker a benchmark runs on (testenv.BenchKafka).
func ForBench(b *testing.B) *Cluster {
	b.Helper()
	return From(testenv.BenchKafka(b, testenv.KafkaConfig{Partitions: autoCreatePartitions}))
}

// From wraps a Kafka of the public kit (a real broker the test started, for instance).
func From(k *testenv.Kafka) *Cluster { return &Cluster{Cluster: k.Cluster, Brokers: k.Seeds, kit: k} }

// Each runs f as the subtests "kfake" (New) and "kafka" (NewReal).
func Each(t *testing.T, f func(t *testing.T, kc *Cluster)) {
	t.Helper()
	t.Run("kfake", func(t *testing.T) { f(t, New(t)) })
	t.Run("kafka", func(t *testing.T) { f(t, NewReal(t)) })
}

// Real reports whether the cluster is a real broker.
func (c *Cluster) Real() bool { return c.kit.Real() }

// Topic returns the name of the test's topic name on this cluster (testenv.Kafka.Topic).
func (c *Cluster) Topic(name string) string { return c.kit.Topic(name) }

// Group returns the name of the test's consumer group name on this cluster.
func (c *Cluster) Group(name string) string { return c.kit.Group(name) }

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
	c.kit.CreateTopic(t, topic, partitions)
}

// ConsumeAll reads every record of topics from the start until n records were read or the
// timeout passes (testenv.Kafka.ConsumeRecords).
func (c *Cluster) ConsumeAll(t testing.TB, n int, timeout time.Duration, topics ...string) []*kgo.Record {
	t.Helper()
	return c.kit.ConsumeRecords(t, n, timeout, topics...)
}
