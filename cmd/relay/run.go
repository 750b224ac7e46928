package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/gctune"
	"github.com/keiro-go/keiro/cmd/internal/kafkaconfig"
	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/internal/httpserver"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
	"github.com/keiro-go/keiro/tracing/otelsetup"
)

// serviceName is the OpenTelemetry service.name of the relay (OTEL_SERVICE_NAME overrides it).
const serviceName = "keiro-relay"

// shutdownReserve is the part of --shutdown-timeout kept for releasing rows, stopping the HTTP
// server and flushing telemetry after the relay stops waiting for in-flight produces.
const shutdownReserve = 2 * time.Second

// relayConfig maps the flags onto the outbox library's configuration.
// With pgbouncer (--pgbouncer) the relay polls only: NOTIFY does not reach a session through
// PgBouncer in transaction mode, and the sleep lock is a session lock.
func (c *runCmd) relayConfig(schema string, pgbouncer bool, log *slog.Logger) outbox.RelayConfig {
	policy, _ := outbox.ParsePolicy(c.Policy) // validated
	retention := c.Retention
	if retention == 0 {
		retention = -1 // the flag's 0 means forever; the library's is negative
	}
	cfg := outbox.RelayConfig{
		Schema:                  schema,
		Policy:                  policy,
		BatchSize:               c.BatchSize,
		MaxInFlightBatches:      c.MaxInFlight,
		ClaimConcurrency:        c.ClaimConcurrency,
		MaxAttempts:             c.MaxAttempts,
		Backoff:                 keiro.Backoff{Initial: c.BackoffInitial, Max: c.BackoffMax, Multiplier: c.BackoffMultiplier},
		Lease:                   c.Lease,
		PollInterval:            c.PollInterval,
		PollOnly:                c.PollOnly || pgbouncer,
		ShutdownTimeout:         relayShutdownTimeout(c.ShutdownTimeout),
		Retention:               retention,
		MaintenanceInterval:     c.MaintenanceInterval,
		VacuumThreshold:         vacuumThreshold(c.VacuumThreshold),
		MaxRecordBytes:          c.MaxRecordBytes,
		Destinations:            c.Destinations,
		CloudEvents:             c.CloudEvents,
		CloudEventsDestinations: c.CloudEventsTopics,
		Mode:                    outbox.Mode(c.Mode),
		LogSlot:                 c.LogSlot,
		LogUnknownTopicRetries:  c.LogUnknownTopicRetries,
		ExactlyOnce:             c.ExactlyOnce,
		OffsetsTopic:            c.OffsetsTopic,
		InstanceID:              c.InstanceID,
		TransactionTimeout:      c.TransactionTimeout,
		TransactionLinger:       c.TransactionLinger,
		Logger:                  log,
	}
	if cfg.Mode == outbox.ModeLog {
		cfg.LogEngine = logrelay.Engine
	}
	return cfg
}

// vacuumThreshold is --vacuum-threshold as RelayConfig.VacuumThreshold: 0 never vacuums.
func vacuumThreshold(flag int64) int64 {
	if flag == 0 {
		return -1
	}
	return flag
}

// declareOrderedSources declares --ordered-sources as ordered streams before a per-source relay
// starts, and warns when such a relay finds no source declared: its order would then be seq
// order, which a transaction that commits late breaks (docs/architecture.md, "Order at enqueue").
func (c *runCmd) declareOrderedSources(ctx context.Context, pool *pgxpool.Pool, schema string, log *slog.Logger) error {
	if c.Policy != outbox.PerSourceStream.String() {
		return nil
	}
	st, err := outbox.NewAdmin(schema)
	if err != nil {
		return err
	}
	if len(c.OrderedSources) > 0 {
		if err := st.DeclarePerSourceOrder(ctx, pool, c.OrderedSources...); err != nil {
			return err
		}
	}
	declared, err := st.PerSourceOrdered(ctx, pool)
	if err != nil {
		return err
	}
	if len(declared) == 0 {
		log.Warn("policy per-source but no source is declared ordered: a transaction that commits late is published after later rows of its source; declare the sources with --ordered-sources")
		return nil
	}
	log.Info("per-source ordered sources", "sources", declared)
	return nil
}

// relayShutdownTimeout is how long the relay waits for in-flight produces: the whole
// --shutdown-timeout less a reserve for what follows (at least half of it is left to produces).
func relayShutdownTimeout(total time.Duration) time.Duration {
	return max(total-shutdownReserve, total/2)
}

// kafkaOpts are the relay client's options: the outbox's producer options (acks=all,
// idempotent, manual flushing), then brokers, TLS and SASL.
func (c *runCmd) kafkaOpts() ([]kgo.Opt, error) {
	kc := c.Kafka
	if kc.ClientID == "" {
		kc.ClientID = DefaultClientID
	}
	conn, err := kc.Opts()
	if err != nil {
		return nil, err
	}
	opts := append(outbox.ProducerOpts(), conn...)
	if codec, ok := compressionCodecs[c.Compression]; ok {
		opts = append(opts, kgo.ProducerBatchCompression(codec))
	}
	if c.MaxBatchBytes > 0 {
		opts = append(opts, kgo.ProducerBatchMaxBytes(c.MaxBatchBytes))
	}
	return opts, nil
}

// Run publishes outbox rows until ctx ends (SIGINT or SIGTERM), then stops claiming, lets
// in-flight rows finish or releases them, and returns nil within --shutdown-timeout.
func (c *runCmd) Run(ctx context.Context, g *grammar, env *cli.Env) error {
	if c.Mode == string(outbox.ModeLog) && g.DB.PgBouncer {
		return errors.New("--mode=log needs a direct connection (a replication connection does not pass through PgBouncer); drop --pgbouncer and point --database-url at PostgreSQL, or run --mode=claim")
	}
	log, err := g.Logger(env.Stderr)
	if err != nil {
		return err
	}
	log.Info("relay starting", "database", g.DB.DatabaseURL, "schema", g.DB.Schema, "brokers", c.Kafka.Brokers,
		"policy", c.Policy, "batch_size", c.BatchSize, "max_in_flight", c.MaxInFlight, "claim_concurrency", c.ClaimConcurrency, "poll_only", c.PollOnly,
		"destinations", c.Destinations, "gc", gctune.Current())
	for _, w := range c.Kafka.Warnings() {
		log.Warn(w)
	}

	tel, err := otelsetup.Setup(ctx, otelsetup.Options{ServiceName: serviceName, ServiceVersion: cli.Build().Version})
	if err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: err} // a bad OTEL_* variable
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownReserve)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("telemetry shutdown", "err", err)
		}
	}()

	if c.Migrate {
		if err := g.DB.MigrationsAllowed("relay migrate"); err != nil {
			return err
		}
	}
	if g.DB.PgBouncer && !c.PollOnly {
		log.Info("--pgbouncer: polling only (NOTIFY does not pass through PgBouncer in transaction mode)", "poll_interval", c.PollInterval)
	}
	if err := prepareSchema(ctx, g, c.Migrate, log); err != nil {
		return err
	}
	pcfg, err := g.DB.PG().ParsePool(g.DB.DatabaseURL.Reveal())
	if err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("--database-url %s: %w", g.DB.DatabaseURL, err)}
	}
	if _, set := pcfg.ConnConfig.RuntimeParams["application_name"]; !set {
		pcfg.ConnConfig.RuntimeParams["application_name"] = outbox.ApplicationName(g.DB.Schema) // counted by the console, poll-only too
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("open database pool for %s: %w", g.DB.DatabaseURL, cli.RedactError(err, g.DB.DatabaseURL))
	}
	defer pool.Close()

	kopts, err := c.kafkaOpts()
	if err != nil {
		return err
	}
	client, err := kgo.NewClient(append(kopts, kafkaconfig.Logger(log), kafkaconfig.ClientMetrics(tel.MeterProvider()))...)
	if err != nil {
		return fmt.Errorf("create kafka client: %w", err)
	}
	defer client.Close()

	if err := c.declareOrderedSources(ctx, pool, g.DB.Schema, log); err != nil {
		return err
	}
	cfg := c.relayConfig(g.DB.Schema, g.DB.PgBouncer, log)
	cfg.MeterProvider, cfg.TracerProvider = tel.MeterProvider(), tel.TracerProvider()
	relay, err := outbox.NewRelay(pool, client, cfg)
	if err != nil {
		return err
	}

	// The HTTP server outlives ctx: /readyz turns 503 when shutdown starts, /metrics stays up
	// until the relay has stopped.
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	httpDone := make(chan error, 1)
	var srv *httpserver.Server
	if c.HTTPAddr != "" {
		admin, err := c.console(pool, g.DB.Schema, relay, log)
		if err != nil {
			return err
		}
		srv, err = httpserver.Listen(httpserver.Config{
			Addr:            c.HTTPAddr,
			Metrics:         tel.MetricsHandler(),
			Admin:           admin,
			ShutdownTimeout: shutdownReserve,
			Checks: []httpserver.Check{
				{Name: "database", Run: pool.Ping},
				{Name: "kafka", Run: client.Ping},
			},
		})
		if err != nil {
			return err
		}
		log.Info("http server listening", "addr", srv.Addr())
		log.Info("operator console", "url", "http://"+srv.Addr()+"/console/", "read_only", c.Admin.AdminReadOnly)
		go func() { httpDone <- srv.Serve(httpCtx) }()
	} else {
		httpDone <- nil
	}

	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()
	log.Info("relay running")

	var runErr error
	select {
	case runErr = <-relayDone:
	case <-ctx.Done():
		if srv != nil {
			srv.SetDraining() // load balancers stop routing before the relay stops
		}
		log.Info("shutting down: no new claims; finishing in-flight rows", "timeout", c.ShutdownTimeout)
		deadline := time.NewTimer(c.ShutdownTimeout)
		defer deadline.Stop()
		select {
		case runErr = <-relayDone:
		case <-deadline.C:
			// The process exits now; rows still claimed are reclaimed when their lease ends.
			return &cli.ExitError{Code: cli.ExitFailure, Err: fmt.Errorf(
				"shutdown did not finish within --shutdown-timeout=%s; claimed rows will be retried after --lease=%s",
				c.ShutdownTimeout, c.Lease)}
		}
	}
	stopHTTP()
	httpErr := <-httpDone
	st := relay.Stats()
	log.Info("relay stopped", "published", st.Published, "retried", st.Retried, "dead", st.Dead,
		"rejected", st.Rejected, "released", st.Released, "batches", st.Batches)
	if eos, ok := relay.ExactlyOnce(); ok {
		log.Info("exactly once", "transactional_id", eos.TransactionalID, "log_transactional_id", eos.LogTransactionalID,
			"committed", eos.Committed, "aborted", eos.Aborted, "fenced", eos.Fenced,
			"recovered_sent", eos.RecoveredSent, "recovered_released", eos.RecoveredReleased)
	}
	if runErr != nil {
		return fmt.Errorf("relay: %w", runErr)
	}
	if httpErr != nil {
		log.Warn("http server", "err", httpErr)
	}
	return nil
}

// console is the admin API and operator console of the outbox and the event store, mounted on
// the HTTP server: open on loopback, token-protected elsewhere.
func (c *runCmd) console(pool *pgxpool.Pool, schema string, relay *outbox.Relay, log *slog.Logger) (*console.Console, error) {
	token, err := c.Admin.Token()
	if err != nil {
		return nil, err
	}
	return console.New(console.Config{
		Outbox:   &console.OutboxConfig{Pool: pool, Schema: schema, MaxAttempts: c.MaxAttempts, ExactlyOnce: relay.ExactlyOnce},
		Events:   &console.EventsConfig{Pool: pool, Schema: schema},
		Auth:     console.AuthConfig{Token: token, AllowUnauthenticated: console.IsLoopback(c.HTTPAddr)},
		ReadOnly: c.Admin.AdminReadOnly,
		Logger:   log,
	})
}

// prepareSchema applies the migrations when asked, and otherwise refuses to start on a schema
// that is behind the binary (the claim SQL needs the current tables).
func prepareSchema(ctx context.Context, g *grammar, migrate bool, log *slog.Logger) error {
	conn, err := g.DB.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if migrate {
		if err := migrations.Migrate(ctx, conn, g.DB.Schema); err != nil {
			return err
		}
	}
	st, err := migrations.GetStatus(ctx, conn, g.DB.Schema)
	if err != nil {
		return err
	}
	switch {
	case st.Current < st.Latest:
		return fmt.Errorf("schema %s is at migration %d of %d: run `relay migrate` or start with --migrate",
			g.DB.Schema, st.Current, st.Latest)
	case st.Current > st.Latest:
		log.Warn("schema is newer than this binary; an older relay may not understand it",
			"schema", g.DB.Schema, "version", st.Current, "binary_version", st.Latest)
	}
	if migrate {
		log.Info("schema migrated", "schema", g.DB.Schema, "version", st.Current)
	}
	return nil
}
