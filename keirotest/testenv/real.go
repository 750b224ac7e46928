package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/goleak"

	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
)

// KafkaBrokersEnv names the environment variable that points the real-broker tests at a
// running Kafka (a comma-separated host:port list) instead of the broker the kit starts.
const KafkaBrokersEnv = "KEIRO_TEST_KAFKA_BROKERS"

// KafkaVersion is the Apache Kafka release the kit starts for real-broker tests.
const KafkaVersion = kafkabroker.Version

// NewRealKafka is NewKafka on a real Apache Kafka broker: the one named by
// KEIRO_TEST_KAFKA_BROKERS, else a single KRaft broker the kit starts once per test process
// from Maven artifacts (it needs Java 17 and Maven; the first start on a machine downloads the
// jars). The broker is shared by every test of the process, so the Kafka is a namespace on it:
// Topic and Group turn a test's names into names of its own, and its topics are deleted when
// it ends.
func NewRealKafka(t testing.TB, topics ...string) *Kafka {
	t.Helper()
	return NewKafkaWith(t, KafkaConfig{Real: true, Topics: topics})
}

// newRealKafka is NewKafkaWith for cfg.Real.
func newRealKafka(t testing.TB, cfg KafkaConfig) *Kafka {
	t.Helper()
	if len(cfg.ClusterOpts) > 0 {
		t.Fatal("keirotest.NewKafkaWith: KafkaConfig.ClusterOpts are options of the embedded broker; a real broker takes none")
	}
	seeds := cfg.Brokers
	if len(seeds) == 0 {
		var err error
		if seeds, err = RealKafkaSeeds(); err != nil {
			t.Fatalf("keirotest: %v", err)
		}
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	k := &Kafka{Seeds: seeds, partitions: cfg.Partitions, real: true, ns: "t" + hex.EncodeToString(b[:]) + "-"}
	k.Client = k.NewClient(t, cfg.ClientOpts...)
	t.Cleanup(func() { k.deleteNamespace(t) })
	for _, topic := range cfg.Topics {
		k.CreateTopic(t, k.Topic(topic), cfg.Partitions)
	}
	return k
}

// Real reports whether the Kafka is a real broker (NewRealKafka) rather than the embedded one.
func (k *Kafka) Real() bool { return k.real }

// Topic returns the name the test's topic called name has on this Kafka: name itself on the
// embedded broker, which the test owns, and name behind the test's namespace prefix on a real
// one, which tests share. Use it wherever the test names a topic, so it runs on both.
func (k *Kafka) Topic(name string) string { return k.ns + name }

// Group returns the name the test's consumer group called name has on this Kafka, as Topic
// does for topics.
func (k *Kafka) Group(name string) string { return k.ns + name }

// deleteNamespace deletes the topics and groups under the Kafka's namespace.
func (k *Kafka) deleteNamespace(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(k.Client)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Logf("keirotest: list topics to delete: %v", err)
		return
	}
	var mine []string
	for _, name := range topics.Names() {
		if strings.HasPrefix(name, k.ns) {
			mine = append(mine, name)
		}
	}
	if len(mine) > 0 {
		if _, err := adm.DeleteTopics(ctx, mine...); err != nil {
			t.Logf("keirotest: delete topics %v: %v", mine, err)
		}
	}
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		return
	}
	var gs []string
	for _, g := range groups.Groups() {
		if strings.HasPrefix(g, k.ns) {
			gs = append(gs, g)
		}
	}
	if len(gs) > 0 {
		_, _ = adm.DeleteGroups(ctx, gs...)
	}
}

// shared is the process's real broker.
var shared struct {
	once    sync.Once
	seeds   []string
	err     error
	cluster *kafkabroker.Cluster
}

// RealKafkaSeeds returns the addresses of the real broker the kit's real-broker tests use:
// KEIRO_TEST_KAFKA_BROKERS when set, else those of a single broker started (once per process,
// and stopped with it) from Maven artifacts.
func RealKafkaSeeds() ([]string, error) {
	if env := strings.TrimSpace(os.Getenv(KafkaBrokersEnv)); env != "" {
		var seeds []string
		for _, s := range strings.Split(env, ",") {
			if s = strings.TrimSpace(s); s != "" {
				seeds = append(seeds, s)
			}
		}
		return seeds, nil
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		c, err := kafkabroker.Start(ctx, kafkabroker.Config{
			// As on most managed clusters: a topic exists because someone created it.
			Props: map[string]string{"auto.create.topics.enable": "false"},
		})
		if err != nil {
			shared.err = fmt.Errorf("start the real Kafka broker (or set %s=host:port): %w", KafkaBrokersEnv, err)
			return
		}
		shared.cluster, shared.seeds = c, c.Seeds()
	})
	if shared.err != nil {
		return nil, shared.err
	}
	if len(shared.seeds) == 0 {
		return nil, errors.New("the real Kafka broker has no address")
	}
	return shared.seeds, nil
}

// EachKafka runs f twice, as the subtests "kfake" (the embedded broker) and "kafka" (a real
// broker, as NewRealKafka), each with a Kafka made from cfg. Name topics and groups through
// Kafka.Topic and Kafka.Group so that both runs work.
func EachKafka(t *testing.T, cfg KafkaConfig, f func(t *testing.T, k *Kafka)) {
	t.Helper()
	for _, real := range []bool{false, true} {
		name := "kfake"
		if real {
			name = "kafka"
		}
		t.Run(name, func(t *testing.T) {
			c := cfg
			c.Real = real
			f(t, NewKafkaWith(t, c))
		})
	}
}

// BenchKafkaEnv names the environment variable that chooses the broker of BenchKafka:
// KEIRO_BENCH_KAFKA=real for a real Apache Kafka, kfake (or unset) for the embedded one.
const BenchKafkaEnv = "KEIRO_BENCH_KAFKA"

// BenchKafka is the Kafka a benchmark runs on, made from cfg: the embedded broker, or a real one
// (as NewRealKafka) when KEIRO_BENCH_KAFKA=real, so that one benchmark gives both figures. Name
// topics and groups through Kafka.Topic and Kafka.Group.
func BenchKafka(b testing.TB, cfg KafkaConfig) *Kafka {
	b.Helper()
	switch v := os.Getenv(BenchKafkaEnv); v {
	case "", "kfake":
		cfg.Real = false
	case "real", "kafka":
		cfg.Real = true
	default:
		b.Fatalf("keirotest: %s=%q: want kfake or real", BenchKafkaEnv, v)
	}
	return NewKafkaWith(b, cfg)
}

// StopRealKafka stops the real broker the kit started for this process, if any; later
// real-broker tests of the process fail. Main calls it.
func StopRealKafka() {
	shared.once.Do(func() { shared.err = errors.New("the real Kafka broker was stopped") })
	if shared.cluster != nil {
		shared.cluster.Close()
	}
}

// Main is a TestMain for packages whose tests use the kit: it runs the tests (Run) and exits
// with their code.
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M, opts ...goleak.Option) { os.Exit(Run(m, opts...)) }

// Run runs the tests, stops the real broker, the schema registry and the trace backend the kit started (if any), and then fails the run
// (returns 1) if goroutines leaked: goleak with LeakOptions and then opts. A TestMain with work
// of its own around the tests (building a binary, removing it afterwards) calls Run and exits
// with its code.
func Run(m *testing.M, opts ...goleak.Option) int {
	code := m.Run()
	StopRealKafka()
	StopSchemaRegistry()
	StopTraceBackend()
	if code == 0 {
		if err := goleak.Find(append(LeakOptions(), opts...)...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// LeakOptions are the goroutines Run does not count as leaks: those the libraries under the kit
// end on their own, a moment after the test closed what owns them.
//
//   - pgxpool's background health check, which exits once it sees its closed pool;
//   - a network read still returning from a connection the test closed (kfake's listeners and
//     a client's broker connections, closed by t.Cleanup).
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	}
}
