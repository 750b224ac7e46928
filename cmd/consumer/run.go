package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/gctune"
	"github.com/keiro-go/keiro/cmd/internal/kafkaconfig"
	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/internal/httpserver"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/tracing/otelsetup"
)

// clientID is the Kafka client id unless --client-id sets one.
const clientID = "keiro-consumer"

// runCmd consumes and processes messages until SIGTERM.
type runCmd struct {
	ID    identityFlags      `embed:""`
	H     handlerFlags       `embed:""`
	Kafka kafkaconfig.Config `embed:""`
	Admin cli.AdminFlags     `embed:""`

	Topics              []string      `help:"Topics to consume, comma separated (required)." placeholder:"TOPIC"`
	DLQTopic            string        `name:"dlq-topic" help:"Dead-letter topic of poisoned and undecodable records (original key, value and headers plus keiro-dlq-* headers); {topic} is replaced by the source topic." default:"{topic}.dlq"`
	MaxAttempts         int           `help:"Handler attempts before a message is poisoned and dead-lettered." default:"5"`
	BatchSize           int           `help:"Most records of a partition in one inbox transaction: a partition takes what is buffered, up to this, without waiting (group commit; a failing record is retried in place, the ones before it commit, the ones after it wait). 0 picks the mode's default: 500 in sql mode, 1 in http mode." default:"0"`
	BackoffInitial      time.Duration `help:"First backoff after a handler failure, an outage of the handler's target or of the database, or a failed dead-letter produce; it doubles up to --backoff-max." default:"100ms"`
	BackoffMax          time.Duration `help:"Longest backoff (a target's Retry-After may ask for more, up to 5m)." default:"10s"`
	Concurrency         int           `help:"Partitions processed in parallel at most." default:"8"`
	MaxBufferedRecords  int           `help:"Records a partition buffers ahead of its worker; a full buffer holds up the next poll, and is paused when another partition needs one." default:"5000"`
	MaxBufferedBytes    int           `help:"Bytes (keys, values, headers) a partition buffers ahead of its worker, bounding memory as --max-buffered-records does; whichever is reached first counts." default:"8388608"`
	IsolationLevel      string        `help:"Which records of transactional producers are read: read_committed (records of aborted Kafka transactions never reach the handler) or read_uncommitted (every record written, aborted ones included)." default:"read_committed"`
	DedupePolicy        string        `help:"Dedupe key: message-id, source-event (source event id, else global position) or kafka-delivery (topic:partition:offset)." default:"message-id"`
	Persistence         string        `help:"What a completed inbox row keeps: full (the envelope) or dedupe-only." default:"full"`
	Retention           time.Duration `help:"How long completed inbox rows are kept: the dedupe window. 0 keeps them forever." default:"168h"`
	MaintenanceInterval time.Duration `help:"Period of inbox retention and the backlog gauge (one consumer instance at a time deletes)." default:"30s"`
	ShutdownTimeout     time.Duration `help:"How long SIGTERM waits for in-flight messages before abandoning them (they are redelivered)." default:"30s"`
	SessionTimeout      time.Duration `help:"Consumer-group session timeout: how long the broker waits for a silent member (a killed consumer's partitions move after this)." default:"45s"`
	RebalanceTimeout    time.Duration `help:"Consumer-group rebalance timeout: how long members get to finish in-flight work and rejoin during a rebalance." default:"60s"`
	HTTPAddr            string        `name:"http-addr" help:"Address of /healthz, /readyz, /metrics, the admin API (/api/v1/) and the console (/console/) (loopback by default); empty disables." default:"127.0.0.1:9465"`
	Migrate             bool          `help:"Apply database migrations before consuming (otherwise pending migrations are an error)."`
	RequireTopics       bool          `help:"Refuse to start (exit 2) when a consumed or dead-letter topic does not exist; without it a missing topic is a warning."`
}

// ValidateFlags reports every problem with the run configuration.
func (c *runCmd) ValidateFlags() error {
	var p cli.Problems
	if c.ID.Group == "" {
		p.Add("group", "is required (or set $%s_GROUP)", EnvPrefix)
	}
	if len(c.Topics) == 0 {
		p.Add("topics", "is required (or set $%s_TOPICS)", EnvPrefix)
	}
	for _, t := range c.Topics {
		if t == "" {
			p.Add("topics", "contains an empty topic name")
		} else if err := envelope.ValidateTopic(t); err != nil {
			p.Add("topics", "topic %q %v (names are separated by commas alone, no spaces)", t, err)
		}
	}
	if c.DLQTopic == "" {
		p.Add("dlq-topic", "must not be empty (default {topic}.dlq)")
	} else {
		p.AddErr("dlq-topic", inbox.ValidateDeadLetterTopic(c.DLQTopic, c.Topics, false))
	}
	if c.MaxAttempts < 1 {
		p.Add("max-attempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	if c.BatchSize < 0 {
		p.Add("batch-size", "must be 0 (the mode's default) or more, got %d", c.BatchSize)
	}
	if c.BackoffInitial <= 0 {
		p.Add("backoff-initial", "must be positive, got %s", c.BackoffInitial)
	}
	if c.BackoffMax < c.BackoffInitial {
		p.Add("backoff-max", "must be at least --backoff-initial (%s), got %s", c.BackoffInitial, c.BackoffMax)
	}
	if c.MaxBufferedRecords < 1 {
		p.Add("max-buffered-records", "must be at least 1, got %d", c.MaxBufferedRecords)
	}
	if c.MaxBufferedBytes < 1 {
		p.Add("max-buffered-bytes", "must be at least 1, got %d", c.MaxBufferedBytes)
	}
	if c.Concurrency < 1 {
		p.Add("concurrency", "must be at least 1, got %d", c.Concurrency)
	}
	if _, err := inbox.ParseIsolationLevel(c.IsolationLevel); err != nil {
		p.Add("isolation-level", "unknown level %q: use read_committed or read_uncommitted", c.IsolationLevel)
	}
	switch c.DedupePolicy {
	case "message-id", "source-event", "kafka-delivery":
	default:
		p.Add("dedupe-policy", "unknown policy %q: use message-id, source-event or kafka-delivery", c.DedupePolicy)
	}
	switch c.Persistence {
	case "full", "dedupe-only":
	default:
		p.Add("persistence", "unknown mode %q: use full or dedupe-only", c.Persistence)
	}
	if c.Retention < 0 {
		p.Add("retention", "must not be negative, got %s", c.Retention)
	}
	if c.MaintenanceInterval <= 0 {
		p.Add("maintenance-interval", "must be positive, got %s", c.MaintenanceInterval)
	}
	if c.ShutdownTimeout <= 0 {
		p.Add("shutdown-timeout", "must be positive, got %s", c.ShutdownTimeout)
	}
	if c.SessionTimeout < time.Second {
		p.Add("session-timeout", "must be at least 1s, got %s", c.SessionTimeout)
	}
	if c.RebalanceTimeout < time.Second {
		p.Add("rebalance-timeout", "must be at least 1s, got %s", c.RebalanceTimeout)
	}
	return p.Err()
}

// Run consumes until ctx is cancelled (SIGTERM or SIGINT), then finishes in-flight messages,
// commits their offsets, leaves the group and returns nil.
func (c *runCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	log, err := g.LogFlags.Logger(env.Stderr)
	if err != nil {
		return err
	}
	for _, w := range c.Kafka.Warnings() {
		log.Warn(w)
	}
	if c.H.Handler == "http" && c.BatchSize > 1 {
		log.Warn("--batch-size above 1 in http mode: when one delivery of a batch fails, the whole batch rolls back and is re-run one by one, so the service sees its batch mates again (with the same Idempotency-Key)")
	}
	tel, err := otelsetup.Setup(ctx, otelsetup.Options{ServiceName: "keiro-consumer", ServiceVersion: cli.Build().Version})
	if err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("set up telemetry: %w", err)} // a bad OTEL_* variable
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("flush telemetry", "err", err)
		}
	}()

	if c.Migrate {
		if err := g.DB.MigrationsAllowed("consumer migrate"); err != nil {
			return err
		}
	}
	pool, err := g.DB.OpenPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := c.checkSchema(ctx, pool, g.DB.Schema, log); err != nil {
		return err
	}

	if err := c.preflight(ctx, pool, log); err != nil {
		return err
	}

	policy := dedupePolicy(c.DedupePolicy)
	h, err := buildHandler(&c.H, c.ID.consumerName(), policy, log)
	if err != nil {
		return err
	}
	defer h.close()

	kopts, err := c.kafkaOpts()
	if err != nil {
		return err
	}
	isolation, err := inbox.ParseIsolationLevel(c.IsolationLevel)
	if err != nil {
		return err // ValidateFlags has refused it already
	}
	retention := c.Retention
	if retention == 0 {
		retention = -1 // keep forever
	}
	consumer, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{
		KafkaOpts: append(kopts[:len(kopts):len(kopts)], kafkaconfig.Logger(log),
			kgo.SessionTimeout(c.SessionTimeout), kgo.RebalanceTimeout(c.RebalanceTimeout), kafkaconfig.ClientMetrics(tel.MeterProvider())),
		Group:          c.ID.Group,
		Topics:         c.Topics,
		IsolationLevel: isolation,
		Store: inbox.StoreConfig{
			Schema:       g.DB.Schema,
			Consumer:     c.ID.consumerName(),
			DedupePolicy: policy,
			Persistence:  persistence(c.Persistence),
			MaxAttempts:  c.MaxAttempts,
		},
		DeadLetterTopic:         c.DLQTopic,
		MaxConcurrentPartitions: c.Concurrency,
		MaxBufferedRecords:      c.MaxBufferedRecords,
		MaxBufferedBytes:        c.MaxBufferedBytes,
		BatchSize:               c.batchSize(),
		Retry:                   keiro.Backoff{Initial: c.BackoffInitial, Max: c.BackoffMax},
		BatchHandler:            h.batch, // sql: one round trip for the calls of a batch
		Retention:               retention,
		MaintenanceInterval:     c.MaintenanceInterval,
		ShutdownTimeout:         c.ShutdownTimeout,
		Logger:                  log,
	}, h.handle)
	if err != nil {
		return err
	}

	// The HTTP endpoints stop after the consumer: /readyz answers 503 while draining.
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	httpDone := make(chan error, 1)
	if c.HTTPAddr != "" {
		admin, closeAdmin, err := c.console(pool, g.DB.Schema, h, consumer, kopts, log)
		if err != nil {
			return err
		}
		defer closeAdmin()
		srv, err := httpserver.Listen(httpserver.Config{
			Addr:    c.HTTPAddr,
			Metrics: tel.MetricsHandler(),
			Admin:   admin,
			Checks:  []httpserver.Check{{Name: "database", Run: pool.Ping}, {Name: "kafka", Run: c.pingKafka(kopts)}},
		})
		if err != nil {
			return err
		}
		go func() { httpDone <- srv.Serve(httpCtx) }()
		go func() {
			<-ctx.Done()
			srv.SetDraining()
		}()
		log.Info("serving /healthz, /readyz and /metrics", "addr", srv.Addr())
		log.Info("operator console", "url", "http://"+srv.Addr()+"/console/", "read_only", c.Admin.AdminReadOnly)
	} else {
		httpDone <- nil
	}

	log.Info("consuming", "group", c.ID.Group, "consumer", c.ID.consumerName(), "topics", c.Topics,
		"handler", c.H.Handler, "dedupe_policy", c.DedupePolicy, "schema", g.DB.Schema, "gc", gctune.Current())
	runErr := consumer.Run(ctx)
	stopHTTP()
	httpErr := <-httpDone
	if runErr != nil {
		return fmt.Errorf("consume: %w", runErr)
	}
	if httpErr != nil {
		return httpErr
	}
	st := consumer.Stats()
	log.Info("stopped", "processed", st.Processed, "duplicates", st.Duplicates,
		"dead_lettered", st.DeadLettered, "committed", st.Committed)
	return nil
}

// console is the admin API and operator console of the inbox and the group's lag, mounted on
// the HTTP server: open on loopback, token-protected elsewhere. Retry runs the configured
// handler; lag is read through a client that joins no group, beside the running consumer's own
// view of its partitions; the dead-letter topics of the consumed topics are listed and replayed
// through that client. Call the returned func to close it.
func (c *runCmd) console(pool *pgxpool.Pool, schema string, h *builtHandler, consumer *inbox.Consumer, kopts []kgo.Opt, log *slog.Logger) (*console.Console, func(), error) {
	token, err := c.Admin.Token()
	if err != nil {
		return nil, nil, err
	}
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, nil, fmt.Errorf("create the console's kafka client: %w", err)
	}
	con, err := console.New(console.Config{
		Inbox: &console.InboxConfig{
			Pool: pool, Schema: schema, Consumer: c.ID.consumerName(), Handler: h.handle,
			MaxAttempts: c.MaxAttempts, Kafka: cl, Group: c.ID.Group, Progress: consumer,
			DeadLetterTopics: c.deadLetterTopics(), Topics: c.Topics,
		},
		Auth:     console.AuthConfig{Token: token, AllowUnauthenticated: console.IsLoopback(c.HTTPAddr)},
		ReadOnly: c.Admin.AdminReadOnly,
		Logger:   log,
	})
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	return con, cl.Close, nil
}

// checkSchema applies migrations when --migrate is set, and otherwise refuses to start on a
// schema that is missing migrations.
func (c *runCmd) checkSchema(ctx context.Context, pool *pgxpool.Pool, schema string, log *slog.Logger) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a connection: %w", err)
	}
	defer conn.Release()
	if c.Migrate {
		if err := migrations.Migrate(ctx, conn.Conn(), schema); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	st, err := migrations.GetStatus(ctx, conn.Conn(), schema)
	if err != nil {
		return err
	}
	if st.Pending() {
		return fmt.Errorf("schema %s is at version %d of %d: run `consumer migrate` or pass --migrate", schema, st.Current, st.Latest)
	}
	log.Debug("schema up to date", "schema", schema, "version", st.Current)
	return nil
}

// kafkaOpts are the Kafka client options of the flags.
func (c *runCmd) kafkaOpts() ([]kgo.Opt, error) {
	k := c.Kafka
	if k.ClientID == "" {
		k.ClientID = clientID
	}
	opts, err := k.Opts()
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	return opts, nil
}

// pingKafka is the readiness check of Kafka: a short-lived client that reaches a broker.
func (c *runCmd) pingKafka(opts []kgo.Opt) func(context.Context) error {
	return func(ctx context.Context) error {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return err
		}
		defer cl.Close()
		if err := cl.Ping(ctx); err != nil {
			return errors.New("no Kafka broker reachable")
		}
		return nil
	}
}

// batchSize is --batch-size, or the mode's default for 0: one delivery per transaction in http
// mode (a failed batch would repeat its mates' requests), group commit otherwise.
func (c *runCmd) batchSize() int {
	switch {
	case c.BatchSize > 0:
		return c.BatchSize
	case c.H.Handler == "http":
		return 1
	}
	return inbox.DefaultBatchSize
}

// deadLetterTopics are the dead-letter topics of the consumed topics (--dlq-topic with {topic}
// replaced), each once.
func (c *runCmd) deadLetterTopics() []string {
	var out []string
	for _, t := range c.Topics {
		if dlq := strings.ReplaceAll(c.DLQTopic, "{topic}", t); !slices.Contains(out, dlq) {
			out = append(out, dlq)
		}
	}
	return out
}
