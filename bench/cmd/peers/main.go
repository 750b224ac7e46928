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
}

func main() {
	var o options
	flag.IntVar(&o.drainN, "n", DefaultDrainEvents, "events pre-enqueued for the drain scenario")
	flag.DurationVar(&o.maxDrain, "max-drain", DefaultMaxDrain, "cut a drain run after this long (its rate is then partial)")
	flag.IntVar(&o.rate, "rate", DefaultRate, "offered rate of the steady scenario (events/s)")
	flag.DurationVar(&o.steady, "steady", DefaultSteadyDuration, "duration of the steady scenario")
	flag.IntVar(&o.consumeN, "consume-n", DefaultConsumeEvents, "records pre-produced for the consumer scenario")
	flag.IntVar(&o.runs, "runs", 1, "runs per contender and scenario (contenders alternate)")
	flag.StringVar(&o.scenarios, "scenarios", "drain,steady,consume", "comma-separated scenarios to run")
	flag.StringVar(&o.contenders, "contenders", "", "comma-separated contenders to run (default all)")
	flag.StringVar(&o.dsn, "dsn", databaseURL(), "PostgreSQL URL (KEIRO_TEST_DATABASE_URL or DATABASE_URL)")
	flag.BoolVar(&o.keepSchemas, "keep", false, "keep the per-run schemas instead of dropping them")
	flag.IntVar(&o.payloadBytes, "payload", DefaultPayloadBytes, "approximate payload size in bytes")
	flag.IntVar(&o.keyCount, "keys", DefaultKeys, "distinct record keys")
	flag.IntVar(&o.partitions, "partitions", DefaultPartitions, "partitions per topic")
	flag.IntVar(&o.maxConnsChild, "pool", 8, "pgxpool max connections of every contender")
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
)

// result is one run of one contender in one scenario.
type result struct {
	contender, scenario string
	want, delivered     int
	duplicates          int
	elapsed             time.Duration
	p50, p99            time.Duration
	cpu                 time.Duration
	maxRSSKiB           int64
	cut                 bool
	note                string
	// enqueue is how long the parent took to pre-enqueue the drain's events (1000 per
	// transaction) through the contender's own enqueue API.
	enqueue time.Duration
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
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		return fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	p := &parent{o: o, brokers: cluster.ListenAddrs()}
	if p.admin, err = kgo.NewClient(kgo.SeedBrokers(p.brokers...)); err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer p.admin.Close()

	fmt.Printf("peers: GOMAXPROCS=%d, drain n=%d (cut at %s), steady %d/s for %s, consume n=%d, %d run(s), payload ≈%d B, %d keys, %d partitions\n",
		numCPU(), o.drainN, o.maxDrain, o.rate, o.steady, o.consumeN, o.runs, o.payloadBytes, o.keyCount, o.partitions)
	var all []result
	for _, sc := range scenarios {
		var cs []contender
		for _, c := range contenders {
			if slices.Contains(c.scenarios, sc) && (only == nil && !c.optional || slices.Contains(only, c.name)) {
				cs = append(cs, c)
			}
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
				fmt.Fprintf(os.Stderr, "    %.0f msgs/s, p50 %s p99 %s, cpu %.2fs, rss %d MiB%s\n", r.rate(),
					r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.cpu.Seconds(), r.maxRSSKiB/1024, r.note)
				all = append(all, r)
			}
		}
		printTable(os.Stdout, sc, cs, all)
	}
	printSettings(os.Stdout, only)
	return nil
}

// parent holds what every run shares: the kfake cluster and an admin client.
type parent struct {
	o       options
	brokers []string
	admin   *kgo.Client
	seq     int
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
}

func (p *parent) startChild(c contender, schema, topic, group string, expect int) (*childProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.Command(exe, "-child", c.name, "-child-schema", schema, "-child-topic", topic,
		"-child-brokers", strings.Join(p.brokers, ","), "-child-group", group,
		"-child-expect", fmt.Sprint(expect), "-dsn", p.o.dsn, "-pool", fmt.Sprint(p.o.maxConnsChild))
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
	cp := &childProc{cmd: cmd, stdin: stdin, lines: make(chan string, 4)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			cp.lines <- sc.Text()
		}
		close(cp.lines)
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
	// Wait closes the stdout pipe, so it runs only after every line was read.
	if err := cp.cmd.Wait(); err != nil {
		errs = append(errs, err)
	}
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
