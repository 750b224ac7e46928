package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/backoff"
)

// Defaults of ConsumerConfig.
const (
	// DefaultDeadLetterTopic names the dead-letter topic of each source topic; "{topic}" is
	// replaced by the record's topic.
	DefaultDeadLetterTopic = "{topic}.dlq"
	// DefaultMaxConcurrentPartitions bounds how many partitions are processed at once.
	DefaultMaxConcurrentPartitions = 8
	// DefaultBatchSize is the most records of a partition in one inbox transaction (group
	// commit): a worker takes what is already buffered for its partition, up to this many,
	// without waiting for more.
	DefaultBatchSize = 500
	// DefaultMaxBufferedRecords is the per-partition backlog at which the consumer stops
	// polling, or pauses fetching that partition until its worker has worked it down to half
	// (see ConsumerConfig.MaxBufferedRecords).
	DefaultMaxBufferedRecords = 5000
	// DefaultMaxBufferedBytes bounds a partition's buffer in bytes (keys, values and headers of
	// its records) as MaxBufferedRecords bounds it in records: large records reach it first.
	DefaultMaxBufferedBytes = 8 << 20
	// DefaultFetchMaxWait is the consumer's kgo.FetchMaxWait: a resumed partition is fetched
	// only after the broker's in-flight long poll returns, so a short wait keeps a paused
	// partition from idling (franz-go's default is 5s). Override it through KafkaOpts.
	DefaultFetchMaxWait = 200 * time.Millisecond
	// DefaultRetryInitial is the first backoff after a handler failure, a database outage or
	// a failed dead-letter produce.
	DefaultRetryInitial = 100 * time.Millisecond
	// DefaultRetryMax caps the backoff.
	DefaultRetryMax = 10 * time.Second
	// DefaultRetryMultiplier doubles the backoff per retry.
	DefaultRetryMultiplier = 2.0
	// DefaultShutdownTimeout bounds how long shutdown and revocation wait for in-flight work.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultMaintenanceInterval is how often the backlog gauge is sampled and retention runs.
	DefaultMaintenanceInterval = 30 * time.Second
	// DefaultCommitEvery is the most records processed between two offset commits of a
	// partition. A busy partition's offsets are committed every 100 ms anyway, so at high rates
	// that interval, not this count, sets the commit rate (an offset commit is a synchronous
	// round trip to the group coordinator).
	DefaultCommitEvery = 5000
	// DefaultMaxContentionRetries is how many times a record whose handler failed on
	// contention (IsContention) is retried without using an attempt.
	DefaultMaxContentionRetries = 50
)

// Dead-letter header names added to the original headers of a dead-lettered record.
const (
	HeaderDLQReason    = "keiro-dlq-reason"
	HeaderDLQError     = "keiro-dlq-error"
	HeaderDLQAttempts  = "keiro-dlq-attempts"
	HeaderDLQTopic     = "keiro-dlq-topic"
	HeaderDLQPartition = "keiro-dlq-partition"
	HeaderDLQOffset    = "keiro-dlq-offset"
	HeaderDLQConsumer  = "keiro-dlq-consumer"
	HeaderDLQAt        = "keiro-dlq-at"
)

// Values of the keiro-dlq-reason header.
const (
	// ReasonDecode: the record is not a valid keiro envelope (the error names the header).
	ReasonDecode = "decode"
	// ReasonSchema: the SchemaDecoder rejected the payload permanently.
	ReasonSchema = "schema"
	// ReasonDedupe: the dedupe policy cannot compute a key for the record.
	ReasonDedupe = "dedupe"
	// ReasonPoisoned: the handler failed MaxAttempts times.
	ReasonPoisoned = "poisoned"
	// ReasonPermanent: the handler returned a Permanent error.
	ReasonPermanent = "permanent"
	// ReasonUnstorable: PostgreSQL refuses the record's content in the inbox row (invalid
	// UTF-8 or a NUL byte in a text header, \u0000 in the attributes, a dedupe key too long
	// for the index): retrying could never store it.
	ReasonUnstorable = "unstorable"
)

// Backoff is keiro's one retry delay, the same type as outbox.Backoff and events.Backoff: a
// capped exponential backoff with equal jitter, where the delay before retry n (1-based) is
// d = min(Max, Initial × Multiplier^(n-1)), drawn uniformly from [d/2, d]. A zero field takes
// the consumer's default (DefaultRetryInitial, DefaultRetryMax, DefaultRetryMultiplier).
type Backoff = backoff.Backoff

// Retry is the former name of [Backoff].
//
// Deprecated: use Backoff; Retry is an alias of it.
type Retry = Backoff

// Commit describes one offset commit, for ConsumerConfig.OnCommitted.
type Commit struct {
	// Topic and Partition name the partition.
	Topic     string
	Partition int32
	// Offset is the committed offset: the next record to read.
	Offset int64
	// Records is how many records this commit covers.
	Records int
}

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Brokers are the seed brokers. Required unless KafkaOpts sets kgo.SeedBrokers.
	Brokers []string
	// KafkaOpts are passed to kgo.NewClient after the consumer's own options (TLS, SASL,
	// client id, fetch tuning). Options that break the runner's guarantees (auto-commit,
	// consumer group callbacks) must not be set. Defaults to none.
	KafkaOpts []kgo.Opt
	// Group is the Kafka consumer group. Required.
	Group string
	// Topics are the topics to consume. Required.
	Topics []string
	// TopicsRegex makes Topics regular expressions matched against all topics. Defaults to false.
	TopicsRegex bool
	// Store configures the inbox. Store.Consumer defaults to Group; its MeterProvider and
	// TracerProvider default to this config's.
	Store StoreConfig
	// DeadLetterTopic is the topic poisoned and undecodable records go to; "{topic}" is
	// replaced by the source topic. It must give a legal Kafka topic that is not consumed
	// ([ValidateDeadLetterTopic]); NewConsumer refuses one that does not. Defaults to
	// DefaultDeadLetterTopic ("{topic}.dlq").
	DeadLetterTopic string
	// MaxConcurrentPartitions bounds how many partitions are processed at once. Defaults to
	// DefaultMaxConcurrentPartitions.
	MaxConcurrentPartitions int
	// BatchSize is the most records of a partition processed in one inbox transaction (group
	// commit, Store.ProcessBatch): a partition's worker takes every record already buffered for
	// the partition, up to BatchSize, without waiting for more, so a trickle keeps the latency
	// of one record and a backlog gets the throughput of batches. Batching keeps every
	// guarantee of one record at a time: if a handler fails, the batch rolls back, the records
	// before the failing one commit in a new transaction, the failing one is retried in place
	// under the rules of one record at a time (attempts, backoff, dead letters), and the ones
	// after it wait; per-partition order of effects is strict, effects are exactly once and
	// offsets are committed only after the records' transactions. Set 1 for handlers that must
	// run one record per transaction (a handler with effects outside the transaction, such as
	// an HTTP call, would repeat them for a failed batch's mates). A batch also takes at most a
	// quarter of MaxBufferedBytes (at least one record), so large records make smaller
	// batches. Defaults to DefaultBatchSize.
	BatchSize int
	// BatchHandler, when set, replaces the Handler passed to NewConsumer (which may then be
	// nil): with BatchSize > 1 it receives each batch's events at once
	// (Store.ProcessBatchWith), otherwise one-event slices; after a failure it is given
	// one-event slices to find the failing event. Defaults to nil.
	BatchHandler BatchHandler
	// MaxBufferedRecords is the per-partition backlog (buffered or in progress) at which the
	// consumer stops polling while the other partitions have records to work on, and pauses the
	// partition's fetching when another one needs a poll (see Stats.FetchPauses). Defaults to
	// DefaultMaxBufferedRecords.
	MaxBufferedRecords int
	// MaxBufferedBytes bounds a partition's records in bytes (keys, values and headers),
	// buffered or in progress (a batch counts until its transaction has ended), acting as
	// MaxBufferedRecords does; whichever is reached first counts. A consumer's memory for
	// records is about the partitions it owns × this, plus one fetch each and the Kafka
	// client's own fetch buffer; docs/operations.md has the whole sizing. Defaults to
	// DefaultMaxBufferedBytes.
	MaxBufferedBytes int
	// CommitEvery is the most records processed between two offset commits of a partition
	// (and the most a worker takes from its buffer at once). A partition's offsets are also
	// committed whenever its worker runs out of buffered records, and at least every 100 ms
	// while it is busy. Offsets are only ever committed after the inbox transactions of their
	// records; what a crash leaves uncommitted is redelivered and skipped as duplicates.
	// Defaults to DefaultCommitEvery.
	CommitEvery int
	// Retry is the backoff between handler retries (below the attempt ceiling), deferred
	// handler failures (contention, outages of the handler's dependencies; an outage's
	// RetryAfter, up to 5 minutes, is the least wait), database outages, transient
	// SchemaDecoder failures and failed dead-letter produces. A negative Retry.Initial
	// retries at once. Defaults to {DefaultRetryInitial, DefaultRetryMax,
	// DefaultRetryMultiplier}.
	Retry Backoff
	// MaxContentionRetries bounds how many times a record whose handler failed on contention
	// (a deadlock, a serialization failure, a lock timeout: IsContention) is retried without
	// using an attempt; past it, each such failure is an ordinary failed attempt, so a handler
	// that always fails that way still ends in the dead-letter topic. An Outage uses no attempt
	// however long it lasts. A negative value counts contention as an ordinary failure at
	// once. Defaults to DefaultMaxContentionRetries.
	MaxContentionRetries int
	// SchemaDecoder, when set, rewrites each decoded event before the inbox sees it (for
	// example Avro to JSON). An error wrapped with Permanent dead-letters the record (reason
	// "schema"); any other error is transient (registry unreachable) and retried with backoff.
	// Defaults to nil.
	SchemaDecoder func(ctx context.Context, ev *envelope.Event) error
	// Retention is how long completed inbox rows are kept (the dedupe window); a negative
	// value disables retention in this process. Defaults to DefaultRetention.
	Retention time.Duration
	// MaintenanceInterval is how often the backlog gauge is sampled and retention runs.
	// Defaults to DefaultMaintenanceInterval.
	MaintenanceInterval time.Duration
	// ShutdownTimeout bounds how long shutdown and revocation wait for in-flight work before
	// abandoning it (abandoned records are redelivered). Defaults to DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// MeterProvider supplies the "keiro" meter. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider supplies the "keiro" tracer. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Logger receives operational messages. Defaults to slog.Default().
	Logger *slog.Logger
	// OnCommitted, when set, is called after each successful offset commit, from the
	// partition's goroutine. Defaults to nil.
	OnCommitted func(Commit)
	// OnDeadLettered, when set, is called after a record's dead-letter produce was
	// acknowledged (before its offset is committed). Defaults to nil.
	OnDeadLettered func(r *kgo.Record, reason string)
}

func (c *ConsumerConfig) setDefaults() {
	if c.Store.Consumer == "" {
		c.Store.Consumer = c.Group
	}
	if c.Store.MeterProvider == nil {
		c.Store.MeterProvider = c.MeterProvider
	}
	if c.Store.TracerProvider == nil {
		c.Store.TracerProvider = c.TracerProvider
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = DefaultDeadLetterTopic
	}
	if c.MaxConcurrentPartitions == 0 {
		c.MaxConcurrentPartitions = DefaultMaxConcurrentPartitions
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxBufferedRecords == 0 {
		c.MaxBufferedRecords = DefaultMaxBufferedRecords
	}
	if c.MaxBufferedBytes == 0 {
		c.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if c.CommitEvery == 0 {
		c.CommitEvery = DefaultCommitEvery
	}
	if c.MaxContentionRetries == 0 {
		c.MaxContentionRetries = DefaultMaxContentionRetries
	}
	c.Retry = c.Retry.WithDefaults(Backoff{Initial: DefaultRetryInitial, Max: DefaultRetryMax, Multiplier: DefaultRetryMultiplier})
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.MaintenanceInterval == 0 {
		c.MaintenanceInterval = DefaultMaintenanceInterval
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *ConsumerConfig) validate() error {
	var errs []error
	if len(c.Brokers) == 0 && len(c.KafkaOpts) == 0 {
		errs = append(errs, errors.New("Brokers: required (or pass kgo.SeedBrokers in KafkaOpts)"))
	}
	if c.Group == "" {
		errs = append(errs, errors.New("Group: required; name the consumer group"))
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("Topics: required; name at least one topic"))
	}
	if c.TopicsRegex {
		for _, t := range c.Topics {
			if _, err := regexp.Compile(t); err != nil {
				errs = append(errs, fmt.Errorf("Topics: %q is not a regular expression: %w", t, err))
			}
		}
	}
	if err := ValidateDeadLetterTopic(c.DeadLetterTopic, c.Topics, c.TopicsRegex); err != nil {
		for _, e := range joined(err) {
			errs = append(errs, fmt.Errorf("DeadLetterTopic: %w", e))
		}
	}
	if c.MaxConcurrentPartitions < 1 {
		errs = append(errs, fmt.Errorf("MaxConcurrentPartitions: must be at least 1, got %d", c.MaxConcurrentPartitions))
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("BatchSize: must be at least 1, got %d", c.BatchSize))
	}
	if c.MaxBufferedBytes < 1 {
		errs = append(errs, fmt.Errorf("MaxBufferedBytes: must be at least 1, got %d", c.MaxBufferedBytes))
	}
	if c.MaxBufferedRecords < 1 {
		errs = append(errs, fmt.Errorf("MaxBufferedRecords: must be at least 1, got %d", c.MaxBufferedRecords))
	}
	if c.CommitEvery < 1 {
		errs = append(errs, fmt.Errorf("CommitEvery: must be at least 1, got %d", c.CommitEvery))
	}
	if err := c.Retry.Validate("Retry"); err != nil {
		errs = append(errs, joined(err)...)
	}
	if c.MaintenanceInterval < 0 || c.ShutdownTimeout < 0 {
		errs = append(errs, errors.New("MaintenanceInterval, ShutdownTimeout: must not be negative"))
	}
	return errors.Join(errs...)
}

// Stats are cumulative counters of a Consumer, for tests and health endpoints.
type Stats struct {
	// Processed counts records whose handler committed.
	Processed int64
	// Duplicates counts records skipped as already processed.
	Duplicates int64
	// HandlerFailures counts failed handler attempts.
	HandlerFailures int64
	// DeadLettered counts records produced to the dead-letter topic.
	DeadLettered int64
	// Committed counts records whose offsets were committed.
	Committed int64
	// StorageErrors counts database errors (outages) that were retried.
	StorageErrors int64
	// Deferred counts handler failures retried without using an attempt (contention, outages
	// of the handler's dependencies).
	Deferred int64
	// FetchPauses counts the times a partition's fetching was paused because its buffer was
	// full while another partition needed a poll (each costs a re-fetch of what the client had
	// already fetched for it; see MaxBufferedRecords).
	FetchPauses int64
}

// Consumer runs a Kafka consumer group whose records go through the inbox. Create it with
// NewConsumer and run it with Run.
type Consumer struct {
	pool  *pgxpool.Pool
	cfg   ConsumerConfig
	h     Handler
	store *Store
	in    *instruments
	log   *slog.Logger
	sem   chan struct{}
	// room wakes the poll loop while it waits for a full buffer (backpressure.go).
	room chan struct{}

	// pollHook, when set (by tests), runs after each poll, before its records are dispatched.
	pollHook func(kgo.Fetches)
	// pressureHook, when set (by tests), is told of holds, pauses and resumes
	// (backpressure.go).
	pressureHook func(pressureEvent, topicPartition)

	mu      sync.Mutex
	workers map[topicPartition]*partitionWorker
	cl      *kgo.Client
	baseCtx context.Context

	processed, duplicates, handlerFailures, deadLettered, committed, storageErrors, deferred atomic.Int64
	fetchPauses                                                                              atomic.Int64
}

type topicPartition struct {
	topic     string
	partition int32
}

// NewConsumer validates cfg and returns a Consumer that runs h for each record.
func NewConsumer(pool *pgxpool.Pool, cfg ConsumerConfig, h Handler) (*Consumer, error) {
	cfg.setDefaults()
	var errs []error
	if pool == nil {
		errs = append(errs, errors.New("pool: required"))
	}
	if h == nil && cfg.BatchHandler == nil {
		errs = append(errs, errors.New("handler: required (or set BatchHandler)"))
	}
	if cfg.BatchHandler != nil {
		h = cfg.BatchHandler.Handler()
	}
	errs = append(errs, cfg.validate())
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("inbox consumer config: %w", err)
	}
	store, err := NewStore(cfg.Store)
	if err != nil {
		return nil, err
	}
	store.group, store.in.group = cfg.Group, cfg.Group
	return &Consumer{
		pool: pool, cfg: cfg, h: h, store: store, in: store.in, log: cfg.Logger,
		sem:     make(chan struct{}, cfg.MaxConcurrentPartitions),
		room:    make(chan struct{}, 1),
		workers: map[topicPartition]*partitionWorker{},
	}, nil
}

// Store returns the consumer's inbox store (for operator commands).
func (c *Consumer) Store() *Store { return c.store }

// Stats returns the consumer's cumulative counters.
func (c *Consumer) Stats() Stats {
	return Stats{
		Processed: c.processed.Load(), Duplicates: c.duplicates.Load(),
		HandlerFailures: c.handlerFailures.Load(), DeadLettered: c.deadLettered.Load(),
		Committed: c.committed.Load(), StorageErrors: c.storageErrors.Load(), Deferred: c.deferred.Load(),
		FetchPauses: c.fetchPauses.Load(),
	}
}

// Run consumes until ctx is cancelled, then finishes in-flight work, commits its offsets,
// leaves the group and returns nil. It returns an error if the Kafka client cannot be built or
// Kafka refuses the consumer's credentials or permissions (after stopping its work).
// Run may be called once.
func (c *Consumer) Run(ctx context.Context) error {
	opts := []kgo.Opt{
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		// A rebalance waits until the records of a poll are handed to their workers: records
		// polled before a revocation then go to the old worker (which drops them when it
		// stops) and never to the worker of a new assignment, ahead of its re-fetch from the
		// committed offset.
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(DefaultFetchMaxWait),
	}
	if c.cfg.TopicsRegex {
		opts = append(opts, kgo.ConsumeRegex())
	}
	if len(c.cfg.Brokers) > 0 {
		opts = append(opts, kgo.SeedBrokers(c.cfg.Brokers...))
	}
	opts = append(opts, c.cfg.KafkaOpts...)
	c.mu.Lock()
	if c.baseCtx != nil {
		c.mu.Unlock()
		return errors.New("inbox consumer: Run called twice; create a new Consumer")
	}
	c.baseCtx = context.WithoutCancel(ctx)
	c.mu.Unlock()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("create kafka consumer client: %w", err)
	}
	c.mu.Lock()
	c.cl = cl
	c.mu.Unlock()
	if err := cl.Ping(ctx); err != nil && isFatalKafkaError(err) {
		cl.Close()
		return fmt.Errorf("connect to kafka: %w (check the credentials of group %s)", err, c.cfg.Group)
	}

	var wg sync.WaitGroup
	mctx, stopMaintenance := context.WithCancel(ctx)
	wg.Go(func() { c.maintain(mctx) })

	var fatal error
	for fatal == nil {
		c.awaitRoom(ctx)
		// Everything the client holds: each partition gets what was fetched for it (at most
		// FetchMaxPartitionBytes), so a uniform backlog reaches every partition evenly.
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			cl.AllowRebalance()
			break
		}
		fetches.EachError(func(topic string, p int32, err error) {
			switch {
			case errors.Is(err, context.Canceled):
			case isFatalKafkaError(err):
				fatal = fmt.Errorf("consume %s: %w (check the credentials and ACLs of group %s)", topic, err, c.cfg.Group)
			default:
				c.log.WarnContext(ctx, "kafka fetch error", "topic", topic, "partition", p, "error", err)
			}
		})
		if c.pollHook != nil {
			c.pollHook(fetches)
		}
		fetches.EachPartition(c.dispatch)
		cl.AllowRebalance()
	}
	stopMaintenance()
	wg.Wait()
	c.stopWorkers(nil, fatal == nil)
	c.closeClient(ctx, cl)
	return fatal
}

// closeClient leaves the group and closes the Kafka client within ShutdownTimeout. Offsets of
// finished work are already committed when it runs, so if leaving the group hangs (a JoinGroup
// in flight during a rebalance can hold franz-go's Close for the broker's rebalance timeout) the
// client is abandoned: the broker expires the member after its session timeout and nothing is
// lost, but the process is not held hostage.
func (c *Consumer) closeClient(ctx context.Context, cl *kgo.Client) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ShutdownTimeout)
	defer cancel()
	if err := cl.LeaveGroupContext(lctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		c.log.WarnContext(ctx, "leave consumer group", "group", c.cfg.Group, "error", err)
	}
	done := make(chan struct{})
	go func() {
		cl.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-lctx.Done():
		c.log.WarnContext(ctx, "kafka client did not close within the shutdown timeout; abandoning it "+
			"(offsets are committed; the group expires this member after its session timeout)",
			"group", c.cfg.Group, "timeout", c.cfg.ShutdownTimeout)
	}
}

// isFatalKafkaError reports errors that retrying cannot fix: authentication and authorization.
func isFatalKafkaError(err error) bool {
	return errors.Is(err, kerr.GroupAuthorizationFailed) || errors.Is(err, kerr.TopicAuthorizationFailed) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed) || errors.Is(err, kerr.SaslAuthenticationFailed)
}

func (c *Consumer) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range assigned {
		for _, p := range parts {
			tp := topicPartition{topic, p}
			if _, ok := c.workers[tp]; ok {
				continue
			}
			w := newPartitionWorker(c, cl, tp)
			c.workers[tp] = w
			go w.run()
		}
	}
	c.signalRoom()
}

func (c *Consumer) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.stopWorkers(revoked, true)
}

func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.stopWorkers(lost, false)
}

// stopWorkers stops the workers of parts (all when nil) and waits for them: each finishes the
// record it is on and, when commit is true, commits what it completed.
func (c *Consumer) stopWorkers(parts map[string][]int32, commit bool) {
	c.mu.Lock()
	var stopping []*partitionWorker
	for tp, w := range c.workers {
		if parts != nil && !containsPartition(parts, tp) {
			continue
		}
		delete(c.workers, tp)
		stopping = append(stopping, w)
	}
	c.mu.Unlock()
	c.signalRoom()
	for _, w := range stopping {
		w.stop(commit)
	}
	if len(stopping) == 0 {
		return
	}
	timer := time.NewTimer(c.cfg.ShutdownTimeout)
	defer timer.Stop()
	for _, w := range stopping {
		select {
		case <-w.done:
		case <-timer.C:
			c.log.Warn("in-flight work did not finish within the shutdown timeout; abandoning it (it will be redelivered)",
				"topic", w.tp.topic, "partition", w.tp.partition)
			for _, w := range stopping {
				w.cancel()
			}
			for _, w := range stopping {
				<-w.done
			}
			return
		}
	}
}

func containsPartition(parts map[string][]int32, tp topicPartition) bool {
	for _, p := range parts[tp.topic] {
		if p == tp.partition {
			return true
		}
	}
	return false
}

func (c *Consumer) dispatch(p kgo.FetchTopicPartition) {
	if len(p.Records) == 0 {
		return
	}
	c.mu.Lock()
	w := c.workers[topicPartition{p.Topic, p.Partition}]
	c.mu.Unlock()
	if w == nil {
		return // revoked meanwhile; the new owner reads these records from the committed offset
	}
	w.enqueue(p.Records, p.HighWatermark)
}

// maintain samples the backlog gauge and runs retention every MaintenanceInterval.
func (c *Consumer) maintain(ctx context.Context) {
	t := time.NewTicker(c.cfg.MaintenanceInterval)
	defer t.Stop()
	attrs := c.in.consumerAttrs(c.cfg.Store.Consumer)
	for {
		c.measureLag(ctx)
		if n, err := c.store.CountFailed(ctx, c.pool); err == nil {
			c.in.backlog.Record(ctx, n, attrs)
		} else if ctx.Err() == nil {
			c.log.WarnContext(ctx, "sample inbox backlog", "error", err)
		}
		if c.cfg.Retention > 0 {
			if err := c.retain(ctx); err != nil && ctx.Err() == nil {
				c.log.WarnContext(ctx, "inbox retention", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// retain deletes completed rows past the retention, one small batch per transaction. Each
// transaction first takes a transaction-scoped advisory lock per (schema, consumer), so only
// one instance at a time deletes, and no session keeps a lock between statements: retention is
// safe behind PgBouncer in transaction mode (a session lock would stay on whichever server
// connection took it, and retention would never run again).
func (c *Consumer) retain(ctx context.Context) error {
	var total int64
	defer func() {
		if total > 0 {
			c.log.InfoContext(ctx, "inbox retention deleted completed rows", "rows", total, "older_than", c.cfg.Retention)
		}
	}()
	for range maxRetentionBatchesPerPass {
		var n int64
		locked := false
		err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, sqlRetentionLock, c.store.cfg.Schema, c.store.cfg.Consumer).Scan(&locked); err != nil {
				return fmt.Errorf("take retention lock: %w", err)
			}
			if !locked {
				return nil // another instance is on it
			}
			var err error
			n, err = c.store.deleteCompletedBatch(ctx, tx, c.cfg.Retention, DefaultDeleteBatch)
			return err
		})
		total += n
		if err != nil || !locked || n < DefaultDeleteBatch {
			return err
		}
	}
	return nil
}

// maxRetentionBatchesPerPass bounds one retention pass, so a large backlog of old completed
// rows is worked down over several maintenance intervals instead of one long pass.
const maxRetentionBatchesPerPass = 100

func (c *Consumer) deadLetterTopic(topic string) string {
	return strings.ReplaceAll(c.cfg.DeadLetterTopic, "{topic}", topic)
}
