package testenv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultPartitions is the partition count of a Kafka's topics.
const DefaultPartitions = 1

// Kafka is the Kafka one test uses: an embedded single-broker cluster the test owns
// (franz-go's kfake: the real protocol on loopback), or a namespace on a real Apache Kafka
// broker (NewRealKafka).
type Kafka struct {
	// Cluster is the kfake cluster, for its control hooks (Cluster.ControlKey) and
	// administration; nil on a real broker.
	Cluster *kfake.Cluster
	// Seeds lists the broker addresses (host:port), for kgo.SeedBrokers or a --brokers flag.
	Seeds []string
	// Client is a franz-go client connected to the cluster, closed when the test ends.
	Client *kgo.Client
	// partitions is the partition count of topics CreateTopic makes when given 0.
	partitions int32
	// real is set on a real broker, where ns prefixes the test's topic and group names.
	real bool
	ns   string
}

// KafkaConfig configures NewKafkaWith.
type KafkaConfig struct {
	// Topics are created before NewKafkaWith returns. Defaults to none.
	Topics []string
	// Partitions is the partition count of Topics and of topics created on first use.
	// Defaults to DefaultPartitions.
	Partitions int32
	// DisableAutoCreate makes producing to, or asking for, a topic that was not created fail
	// with UNKNOWN_TOPIC_OR_PARTITION, as on a broker with auto.create.topics.enable=false.
	// Defaults to false (topics are created on first use). The real broker the kit starts
	// never creates topics on first use.
	DisableAutoCreate bool
	// Real runs the test on a real Apache Kafka broker instead of the embedded one (see
	// NewRealKafka); Topics are then created under the test's namespace (Kafka.Topic).
	// Defaults to false.
	Real bool
	// Brokers, with Real, are the addresses of the real broker to use instead of the shared
	// one (RealKafkaSeeds), for a test that runs a broker of its own. Defaults to none.
	Brokers []string
	// ClusterOpts are applied after the kit's own kfake options (one broker, auto-creation,
	// partitions); the embedded broker only. Defaults to none.
	ClusterOpts []kfake.Opt
	// ClientOpts are applied to Kafka.Client after its seed brokers and FastRetries. Defaults
	// to none.
	ClientOpts []kgo.Opt
}

// NewKafka starts an embedded broker on loopback with topics created (one partition each),
// and a client for it. Both are closed when t ends.
func NewKafka(t testing.TB, topics ...string) *Kafka {
	t.Helper()
	return NewKafkaWith(t, KafkaConfig{Topics: topics})
}

// NewKafkaWith is NewKafka with a configuration.
func NewKafkaWith(t testing.TB, cfg KafkaConfig) *Kafka {
	t.Helper()
	if cfg.Partitions == 0 {
		cfg.Partitions = DefaultPartitions
	}
	if cfg.Partitions < 0 {
		t.Fatalf("keirotest.NewKafkaWith: KafkaConfig.Partitions must be positive, got %d", cfg.Partitions)
	}
	if cfg.Real {
		return newRealKafka(t, cfg)
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(int(cfg.Partitions))}
	if !cfg.DisableAutoCreate {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	if len(cfg.Topics) > 0 {
		opts = append(opts, kfake.SeedTopics(cfg.Partitions, cfg.Topics...))
	}
	c, err := kfake.NewCluster(append(opts, cfg.ClusterOpts...)...)
	if err != nil {
		t.Fatalf("keirotest: start the embedded Kafka broker: %v", err)
	}
	t.Cleanup(c.Close)
	k := &Kafka{Cluster: c, Seeds: c.ListenAddrs(), partitions: cfg.Partitions}
	k.Client = k.NewClient(t, cfg.ClientOpts...)
	return k
}

// FastRetries returns franz-go options for clients of the embedded broker: metadata refreshed
// at most every 10ms and retries after 10ms, so that a client recovers from an injected
// failure (FailProduces) in milliseconds rather than seconds. Loopback needs no more.
func FastRetries() []kgo.Opt {
	return []kgo.Opt{kgo.MetadataMinAge(10 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond })}
}

// NewClient returns a new franz-go client for the cluster, with FastRetries and then opts
// applied after the seed brokers, closed when t ends. A producer or consumer under test usually wants its own client
// (a relay needs one built with outbox.ProducerOpts).
func (k *Kafka) NewClient(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	all := append(append([]kgo.Opt{kgo.SeedBrokers(k.Seeds...)}, FastRetries()...), opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		t.Fatalf("keirotest: create a Kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// CreateTopic creates topic with partitions partitions (0: the Kafka's default) and the
// broker's default replication factor. A topic that already exists is left as it is. On a real
// broker, pass a name from Topic.
func (k *Kafka) CreateTopic(t testing.TB, topic string, partitions int32) {
	t.Helper()
	if partitions == 0 {
		partitions = k.partitions
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(k.Client).CreateTopic(ctx, partitions, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatalf("keirotest: create topic %q: %v", topic, err)
	}
	if k.real {
		// A real broker learns of a new topic from its controller shortly after CreateTopics
		// answers: wait until it leads every partition, so the test's first produce or describe
		// does not meet UNKNOWN_TOPIC_OR_PARTITION.
		if err := waitTopicLed(ctx, k.Client, topic); err != nil {
			t.Fatalf("keirotest: topic %q: %v", topic, err)
		}
	}
}

// waitTopicLed waits until the broker's metadata (past the client's cache) lists topic with a
// leader for each of its partitions.
func waitTopicLed(ctx context.Context, cl *kgo.Client, topic string) error {
	var last error
	for {
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		switch {
		case err != nil:
			last = err
		case len(resp.Topics) != 1:
			last = fmt.Errorf("metadata answered %d topics", len(resp.Topics))
		case resp.Topics[0].ErrorCode != 0:
			last = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
		default:
			led := len(resp.Topics[0].Partitions) > 0
			for _, p := range resp.Topics[0].Partitions {
				led = led && p.ErrorCode == 0 && p.Leader >= 0
			}
			if led {
				return nil
			}
			last = errors.New("a partition has no leader yet")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not led by the broker in time: %v", last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Records returns every record on topic at the time of the call (up to each partition's high
// watermark), ordered by partition and offset, as a read_committed consumer is given them:
// records of aborted transactions, of transactions still open and transaction markers are left
// out. A topic that does not exist has none.
func (k *Kafka) Records(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := k.ReadTopic(ctx, topic)
	if err != nil {
		t.Fatalf("keirotest: read topic %q: %v", topic, err)
	}
	return recs
}

// ReadTopic is Records returning an error instead of failing a test.
func (k *Kafka) ReadTopic(ctx context.Context, topic string) ([]*kgo.Record, error) {
	c, err := ReadCommitted(ctx, k, topic)
	return c.Records, err
}

// Committed is what ReadCommitted read from a topic.
type Committed struct {
	// Records are the committed records in partition and offset order: records of producers
	// that use no transactions and records of committed transactions.
	Records []*kgo.Record
	// Aborted counts the records of aborted transactions that were left out.
	Aborted int
	// Open counts the records of transactions still open at the end offset that were left out.
	Open int
}

// Control record types (the second int16 of a control record's key).
const (
	controlAbort  = 0
	controlCommit = 1
)

// ReadCommitted reads topic from its start up to each partition's high watermark at the time
// of the call and keeps what a read_committed consumer is given. It reads uncommitted with
// control records kept: every offset below the high watermark is then a record it is given
// (data or transaction marker), so reaching the end is known without waiting, even where the
// end is a transaction's marker, and unlike a read_committed client it is not held at the
// first record of an open transaction (the last stable offset); each transactional record is
// kept or dropped by the marker its producer wrote after it. A topic that does not exist has
// no records.
func ReadCommitted(ctx context.Context, k *Kafka, topic string) (Committed, error) {
	ends, err := kadm.NewClient(k.Client).ListEndOffsets(ctx, topic)
	if err != nil {
		return Committed{}, fmt.Errorf("list end offsets: %w", err)
	}
	want := map[int32]int64{} // partition -> high watermark
	var listErr error
	ends.Each(func(o kadm.ListedOffset) {
		switch {
		case errors.Is(o.Err, kerr.UnknownTopicOrPartition):
		case o.Err != nil:
			listErr = o.Err
		case o.Offset > 0:
			want[o.Partition] = o.Offset
		}
	})
	if listErr != nil {
		return Committed{}, fmt.Errorf("list end offsets: %w", listErr)
	}
	if len(want) == 0 {
		return Committed{}, nil
	}
	parts := map[int32]kgo.Offset{}
	for p := range want {
		parts[p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Seeds...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords())
	if err != nil {
		return Committed{}, fmt.Errorf("create a consumer: %w", err)
	}
	defer cl.Close()
	byPartition := map[int32][]*kgo.Record{}
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return Committed{}, fmt.Errorf("read up to the end offsets: %w", err)
		}
		for _, fe := range fs.Errors() {
			return Committed{}, fmt.Errorf("fetch partition %d: %w", fe.Partition, fe.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if hw, ok := want[r.Partition]; ok && r.Offset < hw {
				byPartition[r.Partition] = append(byPartition[r.Partition], r)
				if r.Offset+1 >= hw {
					delete(want, r.Partition)
				}
			}
		})
	}
	partitions := make([]int32, 0, len(byPartition))
	for p := range byPartition {
		partitions = append(partitions, p)
	}
	sort.Slice(partitions, func(i, j int) bool { return partitions[i] < partitions[j] })
	var out Committed
	for _, p := range partitions {
		recs := byPartition[p]
		keep := make([]bool, len(recs))
		open := map[int64][]int{} // producer id -> its records awaiting their transaction's marker
		for i, r := range recs {
			switch {
			case r.Attrs.IsControl():
				if len(r.Key) >= 4 {
					switch int16(binary.BigEndian.Uint16(r.Key[2:4])) {
					case controlCommit:
						for _, j := range open[r.ProducerID] {
							keep[j] = true
						}
					case controlAbort:
						out.Aborted += len(open[r.ProducerID])
					}
				}
				delete(open, r.ProducerID)
			case r.Attrs.IsTransactional():
				open[r.ProducerID] = append(open[r.ProducerID], i)
			default:
				keep[i] = true
			}
		}
		for _, idx := range open {
			out.Open += len(idx)
		}
		for i, r := range recs {
			if keep[i] {
				out.Records = append(out.Records, r)
			}
		}
	}
	return out, nil
}

// ConsumeRecords reads topics from their start, as a new consumer would, until n records
// arrived or timeout passed, and returns them in fetch order: fewer than n if the timeout
// passed, for the test to report. Use it for records a component produces in the background (a
// relay, a consumer's dead-letter topic), which Records, reading up to the end offsets of the
// moment, may miss.
func (k *Kafka) ConsumeRecords(t testing.TB, n int, timeout time.Duration, topics ...string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(k.Seeds...)}, FastRetries()...),
		kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatalf("keirotest: create a Kafka consumer: %v", err)
	}
	defer cl.Close()
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
