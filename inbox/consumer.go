package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/inbox/internal/offsets"
)

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
	// CommitFailures counts the offset commits that failed (the group coordinator out or slow,
	// a rebalance under way); each is retried after the Retry backoff, merged with what was done
	// since (keiro.consumer.commit.failures).
	CommitFailures int64
	// DeadLetterBlocked is the number of partitions waiting now on a failing dead-letter
	// produce (the dead-letter topic missing, not writable, or Kafka unavailable).
	DeadLetterBlocked int64
	// DeadLetterValueOmitted counts dead letters too large for Kafka, written with their value
	// omitted (the original stays at its topic, partition and offset).
	DeadLetterValueOmitted int64
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
	// offsets commits the partitions' offsets, gathered into one request at a time.
	offsets *offsets.Committer

	processed, duplicates, handlerFailures, deadLettered, committed, storageErrors, deferred atomic.Int64
	fetchPauses, commitFailures, dlqBlocked, dlqValueOmitted                                 atomic.Int64
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
	c := &Consumer{
		pool: pool, cfg: cfg, h: h, store: store, in: store.in, log: cfg.Logger,
		sem:     make(chan struct{}, cfg.MaxConcurrentPartitions),
		room:    make(chan struct{}, 1),
		workers: map[topicPartition]*partitionWorker{},
	}
	store.in.dlqBlocked.Store(&blockedSource{consumer: cfg.Store.Consumer, n: &c.dlqBlocked})
	return c, nil
}

// Store returns the consumer's inbox store (for operator commands).
func (c *Consumer) Store() *Store { return c.store }

// Stats returns the consumer's cumulative counters.
func (c *Consumer) Stats() Stats {
	return Stats{
		Processed: c.processed.Load(), Duplicates: c.duplicates.Load(),
		HandlerFailures: c.handlerFailures.Load(), DeadLettered: c.deadLettered.Load(),
		Committed: c.committed.Load(), StorageErrors: c.storageErrors.Load(), Deferred: c.deferred.Load(),
		FetchPauses: c.fetchPauses.Load(), CommitFailures: c.commitFailures.Load(), DeadLetterBlocked: c.dlqBlocked.Load(), DeadLetterValueOmitted: c.dlqValueOmitted.Load(),
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
		kgo.FetchIsolationLevel(c.cfg.IsolationLevel.kgo()),
		// Transaction markers come through to the workers, which hand them to no handler but
		// commit past them: a partition written in Kafka transactions (an exactly-once relay)
		// then ends with a committed offset at its end, and its lag reads 0, not 1.
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(DefaultFetchMaxWait),
	}
	if c.cfg.TopicsRegex {
		opts = append(opts, kgo.ConsumeRegex())
	}
	sizerHook := &fetchSizerHook{}
	opts = append(opts, kgo.WithHooks(sizerHook))
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
	c.offsets = offsets.New(c.baseCtx, c.cfg.ShutdownTimeout)
	c.mu.Unlock()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("create kafka consumer client: %w", err)
	}
	sizerHook.set(newFetchSizer(cl))
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
	w.enqueue(p.Records)
}
