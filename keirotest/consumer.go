package keirotest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// Defaults of RunConsumer.
const (
	// DefaultWaitTimeout bounds how long a Consumer's Wait methods wait for an event.
	DefaultWaitTimeout = 15 * time.Second
	// DefaultConsumerBackoff is the first retry delay of a failed handler under RunConsumer
	// (it doubles up to 20 times this), so that a poison message reaches its attempt ceiling
	// and the dead-letter topic quickly.
	DefaultConsumerBackoff = 20 * time.Millisecond
	// DefaultConsumerShutdownTimeout is the consumer's ShutdownTimeout under RunConsumer.
	DefaultConsumerShutdownTimeout = 5 * time.Second
)

// ConsumerOptions tunes RunConsumer.
type ConsumerOptions struct {
	// Timeout bounds how long the Consumer's Wait methods wait for an event. Defaults to
	// DefaultWaitTimeout.
	Timeout time.Duration
}

// Consumer is an inbox.Consumer that RunConsumer runs in the background for one test. Its
// Wait methods wait for what the consumer did to a message (processed it, dead-lettered it);
// its Require methods assert the consumer's inbox rows without repeating its name. Its
// methods are safe for concurrent use.
type Consumer struct {
	// Consumer is the running consumer (its Stats and Store).
	Consumer *inbox.Consumer
	// Name is the inbox consumer name the consumer's rows are stored under.
	Name string
	// Group is the Kafka consumer group.
	Group string
	// Schema is the schema of the consumer's inbox.
	Schema string

	pool    *pgxpool.Pool
	timeout time.Duration
	events  Progress // counts commits, dead letters and the end of Run: wakes the waiters

	mu          sync.Mutex
	deadLetters []DeadLetter
	committed   map[partition]int64 // the committed offset of each partition

	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run returned
	runErr   error         // Run's error, once done is closed
	stopped  bool          // Stop was called: the test takes Run's error itself
}

// partition names a topic's partition.
type partition struct {
	topic string
	id    int32
}

// DeadLetter is a record the consumer produced to its dead-letter topic, as its
// OnDeadLettered hook reported it (after the produce was acknowledged).
type DeadLetter struct {
	// Record is the record as it was read from its topic (without the dead-letter headers).
	Record *kgo.Record
	// MessageID is the record's keiro-message-id header; empty when it has none.
	MessageID string
	// Reason is why it was dead-lettered: one of the inbox.Reason constants.
	Reason string
}

// RunConsumer runs a real inbox.Consumer with h and cfg against the test's PostgreSQL pool and
// kafka (the embedded broker or a real one), in the background until t ends: a cleanup stops
// it, waits for it, and fails t if Run returned an error (call Consumer.Stop to take the
// error yourself). It returns a handle to wait on the consumer's events.
//
// cfg is the configuration the service runs in production; the kit fills what a test leaves
// empty: Brokers (kafka's seeds), Group (kafka.Group(DefaultConsumer)) and Store.Consumer
// (DefaultConsumer, the name Deliver and the inbox assertions use, when Group is empty too),
// Store.Schema (the schema of the pool's search_path, as for Deliver), Retry
// (DefaultConsumerBackoff doubling up to 20 times that), ShutdownTimeout
// (DefaultConsumerShutdownTimeout) and Logger (warnings to t.Log). FastRetries come before
// cfg.KafkaOpts. OnCommitted and OnDeadLettered are called as well as the kit's own hooks.
// Topics are required; each of them and its dead-letter topic are created (a real broker
// creates none on first use), except with TopicsRegex. At most one ConsumerOptions may be
// given.
func RunConsumer(t testing.TB, pool *pgxpool.Pool, kafka *Kafka, h inbox.Handler, cfg inbox.ConsumerConfig,
	opts ...ConsumerOptions) *Consumer {
	t.Helper()
	const who = "keirotest.RunConsumer"
	if pool == nil || kafka == nil {
		t.Fatalf("%s: pool and kafka are required (got pool %v, kafka %v)", who, pool != nil, kafka != nil)
	}
	if len(opts) > 1 {
		t.Fatalf("%s: at most one ConsumerOptions may be given, got %d", who, len(opts))
	}
	var o ConsumerOptions
	if len(opts) == 1 {
		o = opts[0]
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultWaitTimeout
	}
	if o.Timeout < 0 {
		t.Fatalf("%s: ConsumerOptions.Timeout must be positive, got %s", who, o.Timeout)
	}
	if len(cfg.Topics) == 0 {
		t.Fatalf("%s: inbox.ConsumerConfig.Topics is empty: name the topics the consumer reads", who)
	}
	ctx, cancel := inboxCtx()
	defer cancel()
	schema, err := resolveInboxSchema(ctx, pool, cfg.Store.Schema)
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	cfg.Store.Schema = schema
	if len(cfg.Brokers) == 0 {
		cfg.Brokers = kafka.Seeds
	}
	cfg.KafkaOpts = append(FastRetries(), cfg.KafkaOpts...)
	if cfg.Group == "" {
		cfg.Group = kafka.Group(DefaultConsumer)
		if cfg.Store.Consumer == "" {
			cfg.Store.Consumer = DefaultConsumer
		}
	}
	if cfg.Store.Consumer == "" {
		cfg.Store.Consumer = cfg.Group // as inbox.NewConsumer does
	}
	if cfg.Retry.Initial == 0 {
		cfg.Retry.Initial = DefaultConsumerBackoff
	}
	if cfg.Retry.Max == 0 {
		cfg.Retry.Max = max(20*DefaultConsumerBackoff, cfg.Retry.Initial)
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultConsumerShutdownTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	c := &Consumer{Name: cfg.Store.Consumer, Group: cfg.Group, Schema: schema, pool: pool, timeout: o.Timeout,
		done: make(chan struct{}), committed: map[partition]int64{}}
	userCommitted, userDeadLettered := cfg.OnCommitted, cfg.OnDeadLettered
	cfg.OnCommitted = func(cm inbox.Commit) {
		if userCommitted != nil {
			userCommitted(cm)
		}
		c.mu.Lock()
		c.committed[partition{cm.Topic, cm.Partition}] = cm.Offset
		c.mu.Unlock()
		c.events.Add(1)
	}
	cfg.OnDeadLettered = func(r *kgo.Record, reason string) {
		if userDeadLettered != nil {
			userDeadLettered(r, reason)
		}
		c.mu.Lock()
		id, _ := lastHeader(r.Headers, envelope.HeaderMessageID)
		c.deadLetters = append(c.deadLetters, DeadLetter{Record: r, MessageID: id, Reason: reason})
		c.mu.Unlock()
		c.events.Add(1)
	}
	if !cfg.TopicsRegex {
		template := cfg.DeadLetterTopic
		if template == "" {
			template = inbox.DefaultDeadLetterTopic
		}
		for _, topic := range cfg.Topics {
			kafka.CreateTopic(t, topic, 0)
			if dlq := strings.ReplaceAll(template, "{topic}", topic); envelope.ValidateTopic(dlq) == nil {
				kafka.CreateTopic(t, dlq, 0)
			}
		}
	}
	c.Consumer, err = inbox.NewConsumer(pool, cfg, h)
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	c.cancel = stop
	go func() {
		err := c.Consumer.Run(runCtx)
		c.mu.Lock()
		c.runErr = err
		c.mu.Unlock()
		close(c.done)
		c.events.Add(1)
	}()
	t.Cleanup(func() {
		err := c.stop(cfg.ShutdownTimeout + 30*time.Second)
		c.mu.Lock()
		taken := c.stopped
		c.mu.Unlock()
		if err != nil && !taken {
			t.Errorf("%s: the consumer of group %q stopped with an error (call Consumer.Stop if the test expects it): %v",
				who, c.Group, err)
		}
	})
	return c
}

// Stop stops the consumer, waits until its Run returned and returns Run's error: nil after a
// clean stop, or the error that ended it earlier. The test's cleanup then does not report that
// error; a test that expects the consumer to fail checks it here. Calling Stop again returns the
// same error.
func (c *Consumer) Stop(t testing.TB) error {
	t.Helper()
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	return c.stop(DefaultConsumerShutdownTimeout + 30*time.Second)
}

// stop cancels Run and waits for it at most wait.
func (c *Consumer) stop(wait time.Duration) error {
	c.stopOnce.Do(c.cancel)
	select {
	case <-c.done:
	case <-time.After(wait):
		return fmt.Errorf("the consumer did not stop within %s", wait)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runErr
}

// ended reports whether Run returned, and its error.
func (c *Consumer) ended() (bool, error) {
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return true, c.runErr
	default:
		return false, nil
	}
}

// committedPast reports whether the offset of r's partition was committed past r.
func (c *Consumer) committedPast(r *kgo.Record) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	off, ok := c.committed[partition{r.Topic, r.Partition}]
	return ok && off > r.Offset
}

// DeadLetters returns the records the consumer dead-lettered so far, in the order of their
// acknowledgements.
func (c *Consumer) DeadLetters() []DeadLetter {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.deadLetters)
}

// WaitProcessed waits until the consumer's inbox holds message messageID as completed: its
// handler's effects committed (or a redelivery found them committed). It fails t at once when
// the message was dead-lettered instead, or when the consumer stopped, and after the timeout
// with the consumer's inbox rows and dead letters. It returns the inbox row.
func (c *Consumer) WaitProcessed(t testing.TB, messageID string) InboxRow {
	t.Helper()
	const who = "keirotest.Consumer.WaitProcessed"
	if messageID == "" {
		t.Fatalf("%s: the message id is empty", who)
	}
	var row InboxRow
	c.wait(t, who, fmt.Sprintf("message %q to be processed", messageID), func(ctx context.Context) (bool, error) {
		lines, err := readInbox(ctx, c.pool, c.Schema, c.Name, messageID)
		if err != nil {
			return false, fmt.Errorf("read the inbox of consumer %q: %w", c.Name, err)
		}
		for _, l := range lines {
			switch l.status {
			case InboxCompleted:
				row, err = lookupInbox(ctx, c.pool, c.Schema, c.Name, l)
				return err == nil, err
			case InboxDeadLettered, InboxPoisoned:
				return false, fmt.Errorf("message %q was not processed: its inbox row is %s", messageID, l)
			}
		}
		return false, nil
	})
	return row
}

// WaitDeadLettered waits until the consumer dead-lettered the record whose keiro-message-id is
// messageID (its dead-letter produce was acknowledged) and committed its offset (its inbox row,
// if it has one, is then InboxDeadLettered), and returns it. It fails t at once when
// the message was processed instead, or when the consumer stopped, and after the timeout with
// the consumer's inbox rows and dead letters. RequireDeadLettered then checks the record on the
// dead-letter topic, with the reason and error the consumer gave it.
func (c *Consumer) WaitDeadLettered(t testing.TB, messageID string) DeadLetter {
	t.Helper()
	const who = "keirotest.Consumer.WaitDeadLettered"
	if messageID == "" {
		t.Fatalf("%s: the message id is empty (a record without keiro headers has none: use Consumer.DeadLetters)", who)
	}
	var found DeadLetter
	c.wait(t, who, fmt.Sprintf("message %q to be dead-lettered", messageID), func(ctx context.Context) (bool, error) {
		for _, d := range c.DeadLetters() {
			if d.MessageID == messageID {
				found = d
				return c.committedPast(d.Record), nil
			}
		}
		lines, err := readInbox(ctx, c.pool, c.Schema, c.Name, messageID)
		if err != nil {
			return false, fmt.Errorf("read the inbox of consumer %q: %w", c.Name, err)
		}
		for _, l := range lines {
			if l.status == InboxCompleted {
				return false, fmt.Errorf("message %q was processed, not dead-lettered: its inbox row is %s", messageID, l)
			}
		}
		return false, nil
	})
	return found
}

// wait re-runs check at each of the consumer's events (an offset commit, a dead letter, the
// end of Run) until it reports true, and fails t when it reports an error, when Run ended or
// after the timeout.
func (c *Consumer) wait(t testing.TB, who, what string, check func(ctx context.Context) (bool, error)) {
	t.Helper()
	deadline := time.NewTimer(c.timeout)
	defer deadline.Stop()
	// Offsets are committed after the rows they cover, but a commit that failed is retried
	// without a report: look again now and then too.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		changed := c.events.Changed()
		ctx, cancel := inboxCtx()
		ok, err := check(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v%s", who, err, c.report())
		}
		if ok {
			return
		}
		if ended, runErr := c.ended(); ended {
			t.Fatalf("%s: the consumer stopped before %s (Run returned %v)%s", who, what, runErr, c.report())
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s: timed out after %s waiting for %s%s", who, c.timeout, what, c.report())
		}
	}
}

// report renders what the consumer did, for a failure message.
func (c *Consumer) report() string {
	ctx, cancel := inboxCtx()
	defer cancel()
	var b strings.Builder
	st := c.Consumer.Stats()
	fmt.Fprintf(&b, "\n  consumer %q (group %q, schema %q): processed %d, duplicates %d, failed attempts %d, "+
		"dead-lettered %d, committed %d", c.Name, c.Group, c.Schema, st.Processed, st.Duplicates, st.HandlerFailures,
		st.DeadLettered, st.Committed)
	lines, err := readInbox(ctx, c.pool, c.Schema, c.Name, "")
	switch {
	case err != nil:
		fmt.Fprintf(&b, "\n  its inbox could not be read: %v", err)
	case len(lines) == 0:
		b.WriteString("\n  its inbox is empty (did a record reach the topics it reads?)")
	default:
		fmt.Fprintf(&b, "\n  its inbox holds %s:%s", plural(len(lines), "row"),
			listing(len(lines), func(i int) string { return lines[i].String() }, nil))
	}
	if dls := c.DeadLetters(); len(dls) > 0 {
		fmt.Fprintf(&b, "\n  it dead-lettered %s:%s", plural(len(dls), "record"), listing(len(dls), func(i int) string {
			d := dls[i]
			return fmt.Sprintf("%s partition %d offset %d: message id %q, reason %q", d.Record.Topic, d.Record.Partition,
				d.Record.Offset, d.MessageID, d.Reason)
		}, nil))
	}
	return b.String()
}
