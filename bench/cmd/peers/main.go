package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker" //nolint:depguard // a benchmark, not production code: it starts the test kit's real broker
	"github.com/keiro-go/keiro/migrations"
)

// Defaults of the command's flags.
const (
	// DefaultDrainEvents is the number of events pre-enqueued for the drain scenario.
	DefaultDrainEvents = 100_000
	// DefaultMaxDrain cuts a drain run that has not finished: its rate is then what it
	// delivered in that time (marked "cut" in the table), which keeps the command bounded.
	DefaultMaxDrain = 30 * time.Second
	// DefaultRate is the offered rate of the steady-state scenario, in events per second.
	DefaultRate = 1000
	// DefaultSteadyDuration is how long the steady-state scenario offers its rate.
	DefaultSteadyDuration = 10 * time.Second
	// DefaultConsumeEvents is the number of records pre-produced for the consumer scenario.
	DefaultConsumeEvents = 10_000
	// DefaultPartitions is the partition count of every benchmark topic.
	DefaultPartitions = 8
	// DefaultKeys is the number of distinct record keys.
	DefaultKeys = 1000
	// DefaultPayloadBytes is the approximate size of each event's JSON payload.
	DefaultPayloadBytes = 256
	// DefaultDatabaseURL is used when neither KEIRO_TEST_DATABASE_URL nor DATABASE_URL is set.
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

// options are the parent's flags; child processes receive what they need as child flags.
type options struct {
	drainN        int
	maxDrain      time.Duration
	rate          int
	steady        time.Duration
	consumeN      int
	runs          int
	warmupRuns    int
	scenarios     string
	contenders    string
	dsn           string
	keepSchemas   bool
	child         string
	childSchema   string
	childTopic    string
	childBrokers  string
	childGroup    string
	childExpect   int
	payloadBytes  int
	keyCount      int
	partitions    int
	maxConnsChild int
	kafka         string
	debeziumDir   string
	// netLatency puts a proxy adding it each way between the contenders and PostgreSQL and
	// the broker (0: loopback); cpuLimit limits each contender to that many cores (0: none).
	netLatency time.Duration
	cpuLimit   float64
}

func main() {
	var o options
	flag.IntVar(&o.drainN, "n", DefaultDrainEvents, "events pre-enqueued for the drain scenario")
	flag.DurationVar(&o.maxDrain, "max-drain", DefaultMaxDrain, "cut a drain run after this long (its rate is then partial)")
	flag.IntVar(&o.rate, "rate", DefaultRate, "offered rate of the steady scenario (events/s)")
	flag.DurationVar(&o.steady, "steady", DefaultSteadyDuration, "duration of the steady scenario")
	flag.IntVar(&o.consumeN, "consume-n", DefaultConsumeEvents, "records pre-produced for the consumer scenario")
	flag.IntVar(&o.runs, "runs", 1, "runs per contender and scenario (contenders alternate)")
	flag.IntVar(&o.warmupRuns, "warmup-runs", 2, "unrecorded runs of each contender before a scenario's runs (the broker compiles the paths each contender's traffic takes)")
	flag.StringVar(&o.scenarios, "scenarios", "drain,steady,consume", "comma-separated scenarios to run")
	flag.StringVar(&o.contenders, "contenders", "", "comma-separated contenders to run (default all)")
	flag.StringVar(&o.dsn, "dsn", databaseURL(), "PostgreSQL URL (KEIRO_TEST_DATABASE_URL or DATABASE_URL)")
	flag.BoolVar(&o.keepSchemas, "keep", false, "keep the per-run schemas instead of dropping them")
	flag.IntVar(&o.payloadBytes, "payload", DefaultPayloadBytes, "approximate payload size in bytes")
	flag.IntVar(&o.keyCount, "keys", DefaultKeys, "distinct record keys")
	flag.IntVar(&o.partitions, "partitions", DefaultPartitions, "partitions per topic")
	flag.IntVar(&o.maxConnsChild, "pool", 8, "pgxpool max connections of every contender")
	flag.StringVar(&o.kafka, "kafka", "real", "the broker: real (Apache Kafka started by keirotest/testenv/kafkabroker), kfake (in process), or brokers=host:port[,host:port] (a running cluster)")
	flag.StringVar(&o.debeziumDir, "debezium-dir", "debezium", "the Maven project of the debezium contenders (bench/debezium)")
	flag.DurationVar(&o.netLatency, "net-latency", 0, "put a proxy adding this latency each way between the contenders and PostgreSQL and the broker, e.g. 1ms (needs -kafka real; 0: loopback)")
	flag.Float64Var(&o.cpuLimit, "cpu-limit", 0, "run each contender in a cgroup limited to this many cores, e.g. 0.25 (cgroup v1 cpu controller; 0: no limit)")
	flag.StringVar(&o.child, "child", "", "internal: run one contender (used by the parent)")
	flag.StringVar(&o.childSchema, "child-schema", "", "internal")
	flag.StringVar(&o.childTopic, "child-topic", "", "internal")
	flag.StringVar(&o.childBrokers, "child-brokers", "", "internal")
	flag.StringVar(&o.childGroup, "child-group", "", "internal")
	flag.IntVar(&o.childExpect, "child-expect", 0, "internal")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if o.child != "" {
		err = runChild(ctx, o)
	} else {
		err = runParent(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func databaseURL() string {
	for _, k := range []string{"KEIRO_TEST_DATABASE_URL", "DATABASE_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return DefaultDatabaseURL
}

// contender is one relay or consumer under test.
type contender struct {
	name      string
	scenarios []string // drain, steady, consume
	kind      string   // keiro outbox, watermill forwarder table, skiplocked table, or consume
	settings  string
	guarantee string
	// optional contenders run only when named in -contenders.
	optional bool
	// logMode: the run switches the schema to log mode before its events are written, so
	// that they go to keiro_outbox_log (the log relay and Debezium read it).
	logMode bool
	// emit: the contender's events are written with Store.EmitTx (logical decoding messages)
	// instead of EnqueueTx.
	emit bool
}

var contenders = []contender{
	{name: "keiro", scenarios: []string{"drain", "steady"}, kind: kindKeiro,
		settings:  "outbox.ProducerOpts() (acks=all, idempotent, manual flush); RelayConfig zero value: batch 512, 4 batches in flight, 2 claims at once, LISTEN/NOTIFY + 1 s poll, PerKeyHeadOfLine",
		guarantee: "at least once, per-key order, durable retries/dead state"},
	{name: "keiro-b2048", scenarios: []string{"drain", "steady"}, kind: kindKeiro,
		settings:  "as keiro with RelayConfig.BatchSize 2048 (tuned: with 1000 keys a 512-row claim holds one row per key, so per-key head-of-line lets only ~2 batches be in flight)",
		guarantee: "as keiro", optional: true},
	{name: "keiro-c1", scenarios: []string{"drain", "steady"}, kind: kindKeiro,
		settings:  "as keiro with RelayConfig.ClaimConcurrency 1 (one claim at a time, the setting before 2 became the default)",
		guarantee: "as keiro", optional: true},
	{name: "keiro-if1", scenarios: []string{"drain", "steady"}, kind: kindKeiro,
		settings:  "as keiro with RelayConfig.MaxInFlightBatches 1 (experiment: no claim while a batch is in flight, so no empty claims behind blocked keys)",
		guarantee: "as keiro", optional: true},
	{name: "claim", scenarios: []string{"drain", "steady"}, kind: kindKeiro,
		settings:  "as keiro (the claim relay, RelayConfig{Mode: ModeClaim} zero value), under the name the log-mode comparison uses",
		guarantee: "as keiro", optional: true},
	{name: "log", scenarios: []string{"drain", "steady"}, kind: kindKeiro, logMode: true,
		settings:  "outbox.ProducerOpts(); RelayConfig{Mode: ModeLog, LogEngine: logrelay.Engine}: producers write keiro_outbox_log (insert only), the relay follows its own pgoutput slot in commit order",
		guarantee: "at least once, per-key order (commit order), durable (the slot confirms after Kafka acknowledged)", optional: true},
	{name: "log-emit", scenarios: []string{"drain", "steady"}, kind: kindKeiro, logMode: true, emit: true,
		settings:  "as log, but producers write with Store.EmitTx: each event a transactional logical decoding message (pg_logical_emit_message), no row; the relay decodes them from its slot",
		guarantee: "as log, but no duplicate detection at enqueue and no copy outside the WAL until the slot confirms", optional: true},
	{name: "debezium", scenarios: []string{"drain", "steady"}, kind: kindDebezium, logMode: true,
		settings:  "Debezium embedded 3.6.1.Final (bench/debezium), PostgreSQL connector on its own pgoutput slot and publication over keiro_outbox_log, snapshot.mode no_data, in-memory offsets, EventRouter (route by destination, key message_key, payload payload_bytes, id message_id); documented engine defaults (max.batch.size 2048, max.queue.size 8192, poll.interval.ms 500); KafkaProducer acks=all, idempotent, otherwise defaults; a batch is committed after every record of it was acknowledged; JVM defaults",
		guarantee: "at least once, per-key order (commit order; offsets in memory, so a restart in this setup re-reads from the slot's confirmed position)", optional: true},
	{name: "debezium-tuned", scenarios: []string{"drain", "steady"}, kind: kindDebezium, logMode: true,
		settings:  "as debezium with max.batch.size 8192, max.queue.size 32768, poll.interval.ms 10 (tuned)",
		guarantee: "as debezium", optional: true},
	{name: "watermill-default", scenarios: []string{"drain", "steady"}, kind: kindWatermill,
		settings:  "watermill-sql/v4 DefaultPostgreSQLSchema (SubscribeBatchSize 100) + DefaultPostgreSQLOffsetsAdapter, SubscriberConfig defaults (PollInterval 1 s, AckDeadline 30 s); watermill-kafka/v3 DefaultSaramaSyncPublisherConfig (Version 1.0.0, acks=WaitForLocal, Retry.Max 10), DefaultMarshaler (no key)",
		guarantee: "at least once, total order (one consumer), no key on records, acks=1, not idempotent"},
	{name: "watermill-tuned", scenarios: []string{"drain", "steady"}, kind: kindWatermill,
		settings:  "as default but SubscribeBatchSize 1000, PollInterval 10 ms, Sarama Version 3.6.0, NewWithPartitioningMarshaler(key) so records carry the key",
		guarantee: "at least once, total order (one consumer), keyed records, acks=1, not idempotent"},
	{name: "skiplocked", scenarios: []string{"drain", "steady"}, kind: kindSkipLocked,
		settings:  "BEGIN; SELECT … ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED; franz-go ProduceSync(all 100) with kgo defaults (acks=all, idempotent); UPDATE sent_at; COMMIT; 100 ms poll when empty; partial index WHERE sent_at IS NULL",
		guarantee: "at least once; per-key order only with one relay; no retry state or dead letters"},
	{name: "keiro-consumer", scenarios: []string{"consume"}, kind: kindConsume,
		settings:  "inbox.NewConsumer zero-value config (group commit: what is buffered for a partition, up to BatchSize 500, in one inbox transaction; 8 partitions in parallel), handler INSERTs the effect in the inbox tx",
		guarantee: "exactly-once effects, durable (inbox row + effect in one tx, offsets after commit)"},
	{name: "keiro-consumer-b100", scenarios: []string{"consume"}, kind: kindConsume,
		settings:  "as keiro-consumer with BatchSize 100 (up to 100 records of a partition per inbox transaction)",
		guarantee: "exactly-once effects, durable (inbox row + effect in one tx, offsets after commit)"},
	{name: "keiro-consumer-batch", scenarios: []string{"consume"}, kind: kindConsume, optional: true,
		settings:  "as keiro-consumer with a BatchHandler: the effects of a partition's buffered records (up to BatchSize 500) in one INSERT … SELECT FROM unnest",
		guarantee: "exactly-once effects, durable (inbox row + effect in one tx, offsets after commit)"},
	{name: "watermill-consumer", scenarios: []string{"consume"}, kind: kindConsume,
		settings:  "watermill-kafka/v3 Subscriber (DefaultSaramaSubscriberConfig, Offsets.Initial=Oldest), Router with middleware.Deduplicator{} defaults (Adler-32 of payload, in-memory 1 min window), handler INSERTs the effect (autocommit)",
		guarantee: "at least once; duplicates suppressed only within one process and 1 min; a crash or rebalance between INSERT and offset commit re-runs the effect"},
	{name: "watermill-consumer-uuid", scenarios: []string{"consume"}, kind: kindConsume,
		settings:  "as watermill-consumer but Deduplicator.KeyFactory returns the message uuid (tuned: the default Adler-32 payload hash collides on similar payloads and drops distinct messages)",
		guarantee: "at least once; duplicates suppressed only within one process and 1 min"},
}

const (
	kindKeiro      = "keiro"
	kindWatermill  = "watermill"
	kindSkipLocked = "skiplocked"
	kindConsume    = "consume"
	kindDebezium   = "debezium"
)

// result is one run of one contender in one scenario.
type result struct {
	contender, scenario string
	want, delivered     int
	duplicates          int
	elapsed             time.Duration
	// streaming is the span from the first to the last record the verifier saw (the
	// contender's rate once it streams, without its start-up).
	streaming time.Duration
	p50, p99  time.Duration
	cpu       time.Duration
	maxRSSKiB int64
	cut       bool
	note      string
	// enqueue is how long the parent took to pre-enqueue the drain's events (1000 per
	// transaction) through the contender's own enqueue API.
	enqueue time.Duration
	// walEnqueue and walRelay are the WAL bytes the cluster wrote while the events were
	// enqueued and while the contender ran (pg_current_wal_lsn deltas: cluster-wide).
	walEnqueue, walRelay int64
	// relayCPU is the contender's CPU time from its "ready" to its stop (cpu includes its
	// start-up), pgCPU that of the PostgreSQL backends serving it, brokerCPU the broker's
	// over the same span (0 when the broker is not a local process of ours).
	relayCPU, pgCPU, brokerCPU time.Duration
}

// cpuPerMsg is the CPU time per delivered message of the contender after its start-up, its
// PostgreSQL backends and the broker.
func (r result) cpuPerMsg() time.Duration {
	if r.delivered == 0 {
		return 0
	}
	return (r.relayCPU + r.pgCPU + r.brokerCPU) / time.Duration(r.delivered)
}

// streamingRate is the delivered records per second from the first record to the last.
func (r result) streamingRate() float64 {
	if r.streaming <= 0 || r.delivered < 2 {
		return 0
	}
	return float64(r.delivered-1) / r.streaming.Seconds()
}

func (r result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.delivered) / r.elapsed.Seconds()
}

func runParent(ctx context.Context, o options) error {
	scenarios := strings.Split(o.scenarios, ",")
	var only []string
	if o.contenders != "" {
		only = strings.Split(o.contenders, ",")
	}
	if o.netLatency < 0 || o.cpuLimit < 0 || o.warmupRuns < 0 {
		return errors.New("-net-latency, -cpu-limit and -warmup-runs must not be negative")
	}
	if o.runs < 1 {
		return fmt.Errorf("-runs must be at least 1, got %d", o.runs)
	}
	if o.netLatency > 0 && o.kafka != "real" {
		return fmt.Errorf("-net-latency needs -kafka real (a broker started here can advertise its proxy; -kafka %s cannot)", o.kafka)
	}
	if o.netLatency > 0 && slices.ContainsFunc(only, func(n string) bool { return strings.HasPrefix(n, "debezium") }) {
		return errors.New("-net-latency: the debezium contenders cannot run behind the proxies here (their PostgreSQL CPU is found by the process's own sockets); run them on loopback")
	}
	p := &parent{o: o, childDSN: o.dsn}
	stopKafka, err := p.startKafka(ctx)
	if err != nil {
		return err
	}
	defer stopKafka()
	if slices.ContainsFunc(only, func(n string) bool { return strings.HasPrefix(n, "debezium") }) {
		if p.debeziumCP, err = debeziumBuild(ctx, o.debeziumDir); err != nil {
			return err
		}
	}
	if p.admin, err = kgo.NewClient(kgo.SeedBrokers(p.brokers...)); err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer p.admin.Close()

	fmt.Printf("peers: kafka %s, GOMAXPROCS=%d, drain n=%d (cut at %s), steady %d/s for %s, consume n=%d, %d run(s) after %d unrecorded, payload ≈%d B, %d keys, %d partitions; %s\n",
		o.kafka, numCPU(), o.drainN, o.maxDrain, o.rate, o.steady, o.consumeN, o.runs, o.warmupRuns, o.payloadBytes, o.keyCount, o.partitions, networkNote(o))
	var all []result
	for _, sc := range scenarios {
		var cs []contender
		for _, c := range contenders {
			if slices.Contains(c.scenarios, sc) && (only == nil && !c.optional || slices.Contains(only, c.name)) {
				cs = append(cs, c)
			}
		}
		if err := p.warmUp(ctx, sc, cs); err != nil {
			return err
		}
		// Alternate: run 1 of every contender, then run 2 of every contender (in rotated
		// order), so that load from elsewhere on a shared machine hits all alike.
		for run := range o.runs {
			for i := range cs {
				c := cs[(i+run)%len(cs)]
				if ctx.Err() != nil {
					return ctx.Err()
				}
				fmt.Fprintf(os.Stderr, "  %s: %s run %d…\n", sc, c.name, run+1)
				r, err := p.run(ctx, sc, c)
				if err != nil {
					return fmt.Errorf("%s %s: %w", sc, c.name, err)
				}
				fmt.Fprintf(os.Stderr, "    %.0f msgs/s (%.0f first→last), p50 %s p99 %s, cpu %.2fs (after ready: relay %.2fs, pg %.2fs, broker %.2fs; %.0f µs/msg), rss %d MiB, WAL %s+%s B/ev, load %s%s\n", r.rate(), r.streamingRate(),
					r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.cpu.Seconds(), r.relayCPU.Seconds(), r.pgCPU.Seconds(),
					r.brokerCPU.Seconds(), float64(r.cpuPerMsg())/1e3, r.maxRSSKiB/1024, perEvent(r.walEnqueue, r.want), perEvent(r.walRelay, r.want), loadAvg(), r.note)
				all = append(all, r)
			}
		}
		printTable(os.Stdout, sc, cs, all)
	}
	printSettings(os.Stdout, only)
	return nil
}

// warmUp runs each contender of scenario sc -warmup-runs times, unrecorded, then waits until
// the broker is idle. The broker's JIT compiles the paths each client's traffic takes (its
// request versions, batch shapes, compression, headers) when that traffic first comes: the
// compilation, seconds of broker CPU over a contender's first run (measured: 1.2 s against
// 0.3 s in later runs of the same contender, with about 300 more methods compiled), would
// otherwise be charged to whichever contender's traffic it follows.
func (p *parent) warmUp(ctx context.Context, sc string, cs []contender) error {
	if p.o.warmupRuns <= 0 {
		return nil
	}
	for range p.o.warmupRuns {
		for _, c := range cs {
			fmt.Fprintf(os.Stderr, "  %s: %s warm-up run (not recorded)…\n", sc, c.name)
			if _, err := p.run(ctx, sc, c); err != nil {
				return fmt.Errorf("%s %s warm-up: %w", sc, c.name, err)
			}
		}
	}
	if p.brokerPid != 0 {
		fmt.Fprintf(os.Stderr, "  broker idle after %s\n", p.brokerSettle(ctx).Round(time.Second))
	}
	return nil
}

// parent holds what every run shares: the broker and an admin client.
type parent struct {
	o       options
	brokers []string
	// childDSN is the PostgreSQL URL the contenders connect with: -dsn, or its proxy's.
	childDSN string
	// brokerPid is the broker's process when the command started it as one (-kafka real).
	brokerPid  int
	debeziumCP string
	admin      *kgo.Client
	seq        int
	// slot is the current run's Debezium slot.
	slot string
}

// startKafka starts or finds the broker -kafka names and returns what stops it.
func (p *parent) startKafka(ctx context.Context) (func(), error) {
	switch k := p.o.kafka; {
	case k == "kfake":
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
		if err != nil {
			return nil, fmt.Errorf("start kfake: %w", err)
		}
		p.brokers = cluster.ListenAddrs()
		return cluster.Close, nil
	case k == "real" && p.o.netLatency > 0:
		return p.startNetworkKafka(ctx)
	case k == "real":
		fmt.Fprintf(os.Stderr, "  starting Apache Kafka %s (KRaft, one node)…\n", kafkabroker.Version)
		cluster, err := kafkabroker.Start(ctx, kafkabroker.Config{})
		if err != nil {
			return nil, fmt.Errorf("start Kafka: %w", err)
		}
		p.brokers, p.brokerPid = cluster.Seeds(), cluster.Brokers[0].Pid()
		if err := p.warmBroker(ctx); err != nil {
			cluster.Close()
			return nil, err
		}
		return cluster.Close, nil
	case strings.HasPrefix(k, "brokers="):
		p.brokers = strings.Split(strings.TrimPrefix(k, "brokers="), ",")
		return func() {}, nil
	}
	return nil, fmt.Errorf("-kafka %q: want real, kfake or brokers=host:port", p.o.kafka)
}

// warmBrokerRecords is how many records warmBroker writes and reads back, warmBrokerRequest
// records to a produce request.
const (
	warmBrokerRecords = 300_000
	warmBrokerRequest = 50
)

// warmBroker writes warmBrokerRecords records shaped as the runs' (keyed, of the payload's
// size, to a topic of as many partitions, acks=all) to a topic of its own, half compressed
// as franz-go compresses by default (snappy) and half not (as a Java producer's default), and
// reads them back, before any run. A broker just started compiles its produce and fetch paths
// (the JVM's JIT) during its first few seconds of traffic: without this, the run that came
// first was charged about a second of broker CPU more than the same run later.
func (p *parent) warmBroker(ctx context.Context) error {
	topic := "bench-warmup-" + randomHex(4)
	admin, err := kgo.NewClient(kgo.SeedBrokers(p.brokers...))
	if err != nil {
		return fmt.Errorf("warm-up client: %w", err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	if _, err := adm.CreateTopic(ctx, int32(p.o.partitions), 1, nil, topic); err != nil {
		return fmt.Errorf("create warm-up topic: %w", err)
	}
	defer func() { _, _ = adm.DeleteTopics(context.Background(), topic) }()
	t0 := time.Now()
	gen := newGenerator(p.o.keyCount, p.o.payloadBytes)
	for i, codec := range []kgo.CompressionCodec{kgo.SnappyCompression(), kgo.NoCompression()} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(p.brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(codec))
		if err != nil {
			return fmt.Errorf("warm-up producer: %w", err)
		}
		for n := 0; n < warmBrokerRecords/2; n += warmBrokerRequest {
			recs := make([]*kgo.Record, 0, warmBrokerRequest)
			for _, m := range gen.batch(warmBrokerRequest) {
				recs = append(recs, &kgo.Record{Key: []byte(m.key), Value: m.payload})
			}
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				cl.Close()
				return fmt.Errorf("warm-up produce (%d): %w", i, err)
			}
		}
		cl.Close()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("warm-up consumer: %w", err)
	}
	defer cl.Close()
	for read := 0; read < warmBrokerRecords; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		read += fs.NumRecords()
	}
	warm := time.Since(t0)
	settled := p.brokerSettle(ctx)
	fmt.Fprintf(os.Stderr, "  broker warmed up: %d records written and read in %s, then idle after %s\n",
		warmBrokerRecords, warm.Round(time.Millisecond), settled.Round(time.Second))
	return nil
}

// brokerSettle waits until the broker is idle (under 5 % of a core over a second) or 30 s
// passed, and returns how long it waited: the JIT compiles the code the warm-up ran on
// threads of its own, after the traffic, and that CPU is no run's.
func (p *parent) brokerSettle(ctx context.Context) time.Duration {
	t0 := time.Now()
	prev := procCPU(p.brokerPid)
	for time.Since(t0) < 30*time.Second && ctx.Err() == nil {
		time.Sleep(time.Second)
		cur := procCPU(p.brokerPid)
		if cur-prev < 50*time.Millisecond {
			break
		}
		prev = cur
	}
	return time.Since(t0)
}

func (p *parent) run(ctx context.Context, scenario string, c contender) (result, error) {
	p.seq++
	id := randomHex(4)
	schema := "bench_" + id
	topic := fmt.Sprintf("bench-%s-%s-%d-%s", scenario, c.name, p.seq, id)
	if err := p.createSchema(ctx, schema); err != nil {
		return result{}, err
	}
	if !p.o.keepSchemas {
		defer p.dropSchema(schema)
	}
	if _, err := kadm.NewClient(p.admin).CreateTopic(ctx, int32(p.o.partitions), 1, nil, topic); err != nil {
		return result{}, fmt.Errorf("create topic %s: %w", topic, err)
	}
	conn, err := pgx.Connect(ctx, p.o.dsn)
	if err != nil {
		return result{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	gen := newGenerator(p.o.keyCount, p.o.payloadBytes)
	var slot string
	if c.logMode {
		var cleanup func()
		slot, cleanup, err = p.logSlots(ctx, conn, schema, c)
		defer cleanup() // after the child stopped (the scenario stops it)
		if err != nil {
			return result{}, err
		}
	}
	p.slot = slot
	switch scenario {
	case "drain":
		return p.drain(ctx, conn, schema, topic, c, gen)
	case "steady":
		return p.steadyState(ctx, conn, schema, topic, c, gen)
	case "consume":
		return p.consume(ctx, conn, schema, topic, c, gen)
	}
	return result{}, fmt.Errorf("unknown scenario %q", scenario)
}

// createSchema creates a fresh schema holding keiro's tables, the minimal loop's table,
// Watermill's forwarder tables and the consumers' effects table.
func (p *parent) createSchema(ctx context.Context, schema string) error {
	conn, err := pgx.Connect(ctx, p.o.dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		return fmt.Errorf("migrate keiro tables: %w", err)
	}
	if _, err := conn.Exec(ctx, skipLockedDDL(schema)+effectsDDL(schema)); err != nil {
		return fmt.Errorf("create peer tables: %w", err)
	}
	if err := initWatermillTables(ctx, p.o.dsn, schema); err != nil {
		return err
	}
	return nil
}

func (p *parent) dropSchema(schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.o.dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "drop schema:", err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		fmt.Fprintln(os.Stderr, "drop schema:", err)
	}
}

// childProc is a running contender subprocess.
type childProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	// exited is closed once the child's stdout closed (it exited) and lines was closed.
	exited chan struct{}
	// pg follows the CPU of the PostgreSQL backends serving the child; brokerPid is the
	// broker's process (0: not ours) and cpu0, broker0 the CPU times at "ready".
	pg            *backendCPU
	brokerPid     int
	cpu0, broker0 time.Duration
	// uncgroup removes the child's cgroup (-cpu-limit) once it exited.
	uncgroup func()
}

// markReady records the child's and the broker's CPU time at the child's "ready".
func (cp *childProc) markReady() {
	cp.cpu0, cp.broker0 = procCPU(cp.cmd.Process.Pid), procCPU(cp.brokerPid)
}

// usage returns, before stop, the CPU time since markReady of the child, its PostgreSQL
// backends (their whole life) and the broker.
func (cp *childProc) usage(r *result) {
	r.relayCPU = procCPU(cp.cmd.Process.Pid) - cp.cpu0
	if cp.brokerPid != 0 {
		r.brokerCPU = procCPU(cp.brokerPid) - cp.broker0
	}
	r.pgCPU = cp.pg.total()
}

func (p *parent) startChild(c contender, schema, topic, group string, expect int) (*childProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.Command(exe, "-child", c.name, "-child-schema", schema, "-child-topic", topic,
		"-child-brokers", strings.Join(p.brokers, ","), "-child-group", group,
		"-child-expect", fmt.Sprint(expect), "-dsn", p.childDSN, "-pool", fmt.Sprint(p.o.maxConnsChild))
	if c.kind == kindDebezium {
		variant := "documented"
		if strings.HasSuffix(c.name, "-tuned") {
			variant = "tuned"
		}
		if cmd, err = debeziumCommand(p.debeziumCP, p.o.dsn, schema, p.slot, p.brokers, variant); err != nil {
			return nil, err
		}
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start child: %w", err)
	}
	cp := &childProc{cmd: cmd, stdin: stdin, lines: make(chan string, 4), exited: make(chan struct{}), brokerPid: p.brokerPid,
		pg: startBackendCPU(p.o.dsn, cmd.Process.Pid), uncgroup: func() {}}
	if p.o.cpuLimit > 0 {
		// The child waits for its settings on nothing: the first milliseconds of its start-up
		// may run before the limit applies.
		if cp.uncgroup, err = limitCPU(cmd.Process.Pid, p.o.cpuLimit); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, err
		}
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			cp.lines <- sc.Text()
		}
		close(cp.lines)
		close(cp.exited)
	}()
	return cp, nil
}

// waitLine waits for the child to print want.
func (cp *childProc) waitLine(ctx context.Context, want string, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case l, ok := <-cp.lines:
			if !ok {
				return time.Time{}, fmt.Errorf("child exited before printing %q", want)
			}
			if l == want {
				return time.Now(), nil
			}
		case <-t.C:
			return time.Time{}, fmt.Errorf("child did not print %q within %s", want, timeout)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// stop closes the child's stdin (its signal to shut down gracefully), waits for it and
// returns its CPU time (user+system, from wait4's rusage) and its peak RSS in KiB. The peak RSS
// is the VmHWM the child reports on exit: wait4's ru_maxrss is not used because Linux carries
// the parent's high-water mark into a child across fork+exec, which would charge the parent's
// memory (kfake, the verifier) to every contender.
func (cp *childProc) stop() (time.Duration, int64, error) {
	_ = cp.stdin.Close()
	var hwm int64
	var errs []error
	timeout := time.After(60 * time.Second)
read:
	for {
		select {
		case l, ok := <-cp.lines:
			if !ok {
				break read
			}
			if v, found := strings.CutPrefix(l, "hwm "); found {
				hwm, _ = strconv.ParseInt(v, 10, 64)
			}
		case <-timeout:
			_ = cp.cmd.Process.Kill()
			errs = append(errs, errors.New("child did not stop within 60s; killed"))
			timeout = nil
		}
	}
	if cp.pg != nil {
		cp.pg.total() // stops the sampler if usage did not
	}
	// Wait closes the stdout pipe, so it runs only after every line was read.
	if err := cp.cmd.Wait(); err != nil {
		errs = append(errs, err)
	}
	cp.uncgroup()
	ru, ok := cp.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0, 0, errors.Join(append(errs, errors.New("no rusage"))...)
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return cpu, hwm, errors.Join(errs...)
}

// vmHWM returns this process's peak resident set size in KiB (VmHWM in /proc/self/status).
func vmHWM() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// perEvent formats bytes per event.
func perEvent(bytes int64, n int) string {
	if n == 0 {
		return "—"
	}
	return strconv.FormatInt(bytes/int64(n), 10)
}

// loadAvg returns the machine's 1-minute load average (/proc/loadavg), printed beside every
// run: the figures of a shared machine are read with it.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
