package keirotest

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The test environment (package testenv), re-exported: a migrated schema per test and an
// embedded Kafka broker.

// DefaultDatabaseURL is the database used when neither KEIRO_TEST_DATABASE_URL nor
// DATABASE_URL is set: a local PostgreSQL with trust authentication,
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
const DefaultDatabaseURL = testenv.DefaultDatabaseURL

// DefaultMaxConns is the pool size of a DB: 16.
const DefaultMaxConns = testenv.DefaultMaxConns

// DefaultPartitions is the partition count of a Kafka's topics: 1.
const DefaultPartitions = testenv.DefaultPartitions

type (
	// DB is one test's migrated PostgreSQL schema and a pool whose connections use it as their
	// search_path (testenv.DB: Pool, Schema, ConnString).
	DB = testenv.DB
	// DBConfig configures NewDBWith (testenv.DBConfig).
	DBConfig = testenv.DBConfig
	// KafkaConfig configures NewKafkaWith (testenv.KafkaConfig).
	KafkaConfig = testenv.KafkaConfig
	// ProduceFailure describes produce requests the embedded broker refuses, for
	// Kafka.FailProduces (testenv.ProduceFailure).
	ProduceFailure = testenv.ProduceFailure
	// Outage is a produce failure in progress (testenv.Outage: End, Hit, Refused, Ended).
	Outage = testenv.Outage
	// Progress counts what a component reports through its hooks, for a test to wait on
	// (testenv.Progress: Add, Set, Value, Wait).
	Progress = testenv.Progress
	// LogBuffer collects a component's log output while its goroutines write
	// (testenv.LogBuffer: Write, String).
	LogBuffer = testenv.LogBuffer
)

// DatabaseURL returns the test database's connection string: KEIRO_TEST_DATABASE_URL, else
// DATABASE_URL, else DefaultDatabaseURL.
func DatabaseURL() string { return testenv.DatabaseURL() }

// NewDB creates a schema unique to t on the database named by DatabaseURL, applies keiro's
// migrations to it, and opens a pool whose search_path is that schema. The schema is dropped
// and the pool closed when t ends. Safe with t.Parallel.
func NewDB(t testing.TB) *DB {
	t.Helper()
	return testenv.NewDB(t)
}

// NewDBWith is NewDB with a configuration.
func NewDBWith(t testing.TB, cfg DBConfig) *DB {
	t.Helper()
	return testenv.NewDBWith(t, cfg)
}

// NewSchema creates a schema unique to t on pool's database, applies keiro's migrations to
// it and returns its name; it is dropped when t ends. pool's search_path is left alone: pass
// the name to the components' Schema fields (and to the kit's options). Safe with
// t.Parallel.
func NewSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	return testenv.NewSchema(t, pool)
}

// NewKafka starts an embedded broker on loopback with topics created (one partition each),
// and a client for it. Both are closed when t ends. kafka.FailProduces injects produce
// failures.
func NewKafka(t testing.TB, topics ...string) *Kafka {
	t.Helper()
	return wrapKafka(testenv.NewKafka(t, topics...))
}

// NewKafkaWith is NewKafka with a configuration.
func NewKafkaWith(t testing.TB, cfg KafkaConfig) *Kafka {
	t.Helper()
	return wrapKafka(testenv.NewKafkaWith(t, cfg))
}

// FastRetries returns franz-go options for clients of the embedded broker: metadata refreshed
// at most every 10ms and retries after 10ms, so that a client recovers from an injected
// failure (Kafka.FailProduces) in milliseconds rather than seconds.
func FastRetries() []kgo.Opt { return testenv.FastRetries() }

// KafkaBrokersEnv names the environment variable that points the real-broker tests at a
// running Kafka (a comma-separated host:port list): KEIRO_TEST_KAFKA_BROKERS.
const KafkaBrokersEnv = testenv.KafkaBrokersEnv

// KafkaVersion is the Apache Kafka release the kit starts for real-broker tests.
const KafkaVersion = testenv.KafkaVersion

// NewRealKafka is NewKafka on a real Apache Kafka broker: the one named by
// KEIRO_TEST_KAFKA_BROKERS, else a single KRaft broker the kit starts once per test process
// (Java 17 and Maven needed). The broker is shared by the process's tests: name topics and
// groups through Kafka.Topic and Kafka.Group.
func NewRealKafka(t testing.TB, topics ...string) *Kafka {
	t.Helper()
	return wrapKafka(testenv.NewRealKafka(t, topics...))
}

// EachKafka runs f as the subtests "kfake" (the embedded broker) and "kafka" (a real one).
func EachKafka(t *testing.T, cfg KafkaConfig, f func(t *testing.T, k *Kafka)) {
	t.Helper()
	testenv.EachKafka(t, cfg, func(t *testing.T, k *testenv.Kafka) { f(t, wrapKafka(k)) })
}

// SchemaRegistry is a namespace on the real schema registry: its URL for the service's registry
// configuration, Name for subjects and for the topics they derive from, and SetCompatibility.
type SchemaRegistry = testenv.SchemaRegistry

// SchemaRegistryURLEnv names the environment variable that points the kit at a running
// Confluent-compatible schema registry: KEIRO_TEST_SCHEMA_REGISTRY_URL.
const SchemaRegistryURLEnv = testenv.SchemaRegistryURLEnv

// Compatibility levels of SchemaRegistry.SetCompatibility (Confluent's names).
const (
	CompatibilityNone     = testenv.CompatibilityNone
	CompatibilityBackward = testenv.CompatibilityBackward
	CompatibilityForward  = testenv.CompatibilityForward
	CompatibilityFull     = testenv.CompatibilityFull
)

// NewSchemaRegistry returns a namespace on the real schema registry: the one named by
// KEIRO_TEST_SCHEMA_REGISTRY_URL, else an Apicurio Registry the kit starts once per test
// process (Java 17 and Maven needed; Java 21+ runs the current release). Name the test's subjects,
// and the topics they derive from, through SchemaRegistry.Name.
func NewSchemaRegistry(t testing.TB) *SchemaRegistry {
	t.Helper()
	return testenv.NewSchemaRegistry(t)
}

// TraceBackend is a real OpenTelemetry trace backend (Jaeger v2): OTLPEndpoint (and
// OTLPGRPCEndpoint) for the processes under test, WaitTrace to read a trace back.
type TraceBackend = testenv.TraceBackend

// Span is one span read back from the trace backend.
type Span = testenv.Span

// SpanLink is one link of a Span.
type SpanLink = testenv.SpanLink

// TraceBackendEnv names the environment variable that points the kit at a running Jaeger:
// KEIRO_TEST_TRACE_BACKEND=otlp=URL,query=URL.
const TraceBackendEnv = testenv.TraceBackendEnv

// NewTraceBackend returns the process's trace backend: the one named by KEIRO_TEST_TRACE_BACKEND,
// else a Jaeger v2 the kit starts once per test process (built from the Go module proxy the first
// time on a machine, which takes minutes).
func NewTraceBackend(t testing.TB) *TraceBackend {
	t.Helper()
	return testenv.NewTraceBackend(t)
}

// Main is a TestMain for packages whose tests use the kit: it runs the tests, stops the real
// broker, schema registry and trace backend the kit started (if any), then fails the run if goroutines leaked (goleak, with
// LeakOptions and opts).
func Main(m *testing.M, opts ...goleak.Option) { testenv.Main(m, opts...) }

// Run is Main returning the exit code, for a TestMain with work of its own around the tests.
func Run(m *testing.M, opts ...goleak.Option) int { return testenv.Run(m, opts...) }

// LeakOptions are the goroutines Main does not count as leaks: those pgx and franz-go end on
// their own a moment after the test closed what owns them.
func LeakOptions() []goleak.Option { return testenv.LeakOptions() }

// WaitFor polls cond every 10ms until it reports true, failing t with what when timeout passes
// first. Prefer a Progress where the component reports its work through a hook.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, cond)
}

// BenchKafkaEnv names the environment variable that puts BenchKafka on a real broker:
// KEIRO_BENCH_KAFKA=real.
const BenchKafkaEnv = testenv.BenchKafkaEnv

// BenchKafka is the Kafka a benchmark runs on: the embedded broker, or a real one when
// KEIRO_BENCH_KAFKA=real, so that one benchmark gives both figures.
func BenchKafka(b testing.TB, cfg KafkaConfig) *Kafka {
	b.Helper()
	return wrapKafka(testenv.BenchKafka(b, cfg))
}
