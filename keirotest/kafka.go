package keirotest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// Kafka is the Kafka one test uses: an embedded single-broker cluster the test owns (NewKafka:
// franz-go's kfake, the real protocol on loopback), or the test's namespace on a real Apache
// Kafka broker (NewRealKafka). Its fields Cluster, Seeds and Client come from the embedded
// testenv.Kafka:
//
//   - Cluster is the kfake cluster, for its control hooks; nil on a real broker.
//   - Seeds lists the broker addresses (host:port), for kgo.SeedBrokers or a --brokers flag.
//   - Client is a franz-go client connected to the cluster, closed when the test ends.
//
// Pass k.Kafka where code of yours takes the environment's *testenv.Kafka.
type Kafka struct {
	// Kafka is the environment's broker handle (package testenv), whose fields and methods
	// these are.
	*testenv.Kafka
}

// wrapKafka returns the kit's handle of k.
func wrapKafka(k *testenv.Kafka) *Kafka { return &Kafka{Kafka: k} }

// NewClient returns a new franz-go client for the cluster, built with the seed brokers,
// FastRetries and then opts, and closed when t ends. A producer or consumer under test
// usually wants a client of its own (a relay needs one built with outbox.ProducerOpts).
func (k *Kafka) NewClient(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return k.Kafka.NewClient(t, opts...)
}

// CreateTopic creates topic with partitions partitions (0: the Kafka's default,
// KafkaConfig.Partitions) and the broker's default replication factor. A topic that already
// exists is left as it is. On a real broker, pass a name from Topic; CreateTopic waits until
// the broker leads every partition.
func (k *Kafka) CreateTopic(t testing.TB, topic string, partitions int32) {
	t.Helper()
	k.Kafka.CreateTopic(t, topic, partitions)
}

// Records returns every record on topic at the time of the call (up to each partition's
// high watermark), ordered by partition and offset, as a read_committed consumer is given them:
// records of aborted or still open transactions and transaction markers are left out
// (CommittedRecords counts them). A topic that does not exist has none.
// For records a component produces in the background, use ConsumeRecords or the Within field
// of the assertions.
func (k *Kafka) Records(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	return k.Kafka.Records(t, topic)
}

// ReadTopic is Records returning an error instead of failing a test.
func (k *Kafka) ReadTopic(ctx context.Context, topic string) ([]*kgo.Record, error) {
	return k.Kafka.ReadTopic(ctx, topic)
}

// ConsumeRecords reads topics from their start, as a new consumer would, until n records
// arrived or timeout passed, and returns them in fetch order: fewer than n if the timeout
// passed, for the test to report.
func (k *Kafka) ConsumeRecords(t testing.TB, n int, timeout time.Duration, topics ...string) []*kgo.Record {
	t.Helper()
	return k.Kafka.ConsumeRecords(t, n, timeout, topics...)
}

// FailProduces makes the embedded broker refuse produce requests as f describes, from now
// until Outage.End, the limits of f (Requests, For), or the end of t, whichever comes first.
// Requests it does not refuse are handled normally. Use it to test what a service does while
// Kafka is down. A real broker (NewRealKafka) has no hook for it: the test fails.
//
// The default error, NOT_LEADER_FOR_PARTITION, is retriable: a relay rides it out without
// using attempts. A non-retriable one (ProduceFailure.Err = kerr.MessageTooLarge) makes the
// relay reject the rows. After a retriable error franz-go waits for a metadata refresh before
// it retries; clients built with FastRetries (as NewClient and DrainOutbox build them)
// recover in milliseconds.
//
//	outage := kafka.FailProduces(t, keirotest.ProduceFailure{})
//	// ... enqueue, run the relay ...
//	<-outage.Hit() // a produce was refused
//	outage.End()
func (k *Kafka) FailProduces(t testing.TB, f ProduceFailure) *Outage {
	t.Helper()
	return k.Kafka.FailProduces(t, f)
}

// Real reports whether the Kafka is a real broker (NewRealKafka) rather than the embedded one.
func (k *Kafka) Real() bool { return k.Kafka.Real() }

// Topic returns the name the test's topic called name has on this Kafka: name itself on the
// embedded broker, which the test owns, and name behind the test's namespace prefix on a real
// one, which tests share. Use it wherever the test names a topic, so that it runs on both.
func (k *Kafka) Topic(name string) string { return k.Kafka.Topic(name) }

// Group returns the name the test's consumer group called name has on this Kafka, as Topic
// does for topics.
func (k *Kafka) Group(name string) string { return k.Kafka.Group(name) }
