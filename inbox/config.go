package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
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
	// IsolationLevel is which records of transactional producers are read. Under the default,
	// ReadCommitted, a record of an aborted Kafka transaction never reaches the handler or the
	// inbox, and a partition is read only up to its last stable offset (records behind an open
	// transaction wait for its end). ReadUncommitted hands over every record written, aborted
	// ones included. Defaults to ReadCommitted.
	IsolationLevel IsolationLevel
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
	// SchemaDecoder failures, failed dead-letter produces and failed offset commits (retried
	// on their own when no record follows). A negative Retry.Initial
	// retries at once. Defaults to {DefaultRetryInitial, DefaultRetryMax,
	// DefaultRetryMultiplier}.
	Retry keiro.Backoff
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
	c.Retry = c.Retry.WithDefaults(keiro.Backoff{Initial: DefaultRetryInitial, Max: DefaultRetryMax, Multiplier: DefaultRetryMultiplier})
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
	if c.IsolationLevel != ReadCommitted && c.IsolationLevel != ReadUncommitted {
		errs = append(errs, fmt.Errorf("IsolationLevel: unknown level %d; use ReadCommitted or ReadUncommitted", c.IsolationLevel))
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
