package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/internal/httpserver"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

// Defaults of Config.
const (
	// DefaultOrders is how many orders the demo places.
	DefaultOrders = 200
	// DefaultCustomers is how many customers (Kafka keys) the orders are spread over.
	DefaultCustomers = 16
	// DefaultProducers is how many goroutines place orders at once.
	DefaultProducers = 4
	// DefaultDuplicates is how many published records the demo delivers a second time.
	DefaultDuplicates = 10
	// DefaultDatabaseURL is the local PostgreSQL the README documents.
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	// DefaultSchema is the schema the demo drops and recreates.
	DefaultSchema = "keiro_demo"
	// DefaultTopic is the topic of the orders context's integration events.
	DefaultTopic = "demo.orders.v1"
	// DefaultPartitions is the topic's partition count when the demo creates it.
	DefaultPartitions = 3
	// DefaultTimeout bounds the wait for the pipeline to drain.
	DefaultTimeout = 2 * time.Minute
	// DefaultConsoleAddr is the demo command's console address: loopback, next to the
	// sidecars' default ports.
	DefaultConsoleAddr = "127.0.0.1:9466"
	// ConsumerGroup is the billing context's consumer group and inbox consumer name.
	ConsumerGroup = "billing"
	// Source is the orders context's name, the integration events' source.
	Source = "orders"
)

// Config configures a demo run. The zero value runs the default demo.
type Config struct {
	// Orders is the number of orders placed. Defaults to DefaultOrders.
	Orders int
	// Customers is the number of customers (Kafka keys). Defaults to DefaultCustomers.
	Customers int
	// Producers is the number of goroutines placing orders. Defaults to DefaultProducers.
	Producers int
	// Duplicates is the number of published records delivered a second time; negative means
	// none. Defaults to DefaultDuplicates.
	Duplicates int
	// DatabaseURL is the PostgreSQL URL. Defaults to DefaultDatabaseURL.
	DatabaseURL string
	// Schema is the schema the demo drops and recreates. Defaults to DefaultSchema.
	Schema string
	// Brokers are a real Kafka's seed brokers. Defaults to an embedded broker.
	Brokers []string
	// Topic is the orders topic. Defaults to DefaultTopic (plus a per-run suffix with Brokers).
	Topic string
	// Partitions is the topic's partition count when the demo creates it. Defaults to
	// DefaultPartitions.
	Partitions int
	// Avro publishes Avro payloads through a schema registry. Defaults to false (JSON).
	Avro bool
	// SchemaRegistryURL is the registry for Avro. Defaults to an embedded registry.
	SchemaRegistryURL string
	// Timeout bounds the wait for the pipeline to drain. Defaults to DefaultTimeout.
	Timeout time.Duration
	// Quiet prints only the final table. Defaults to false.
	Quiet bool
	// ConsoleAddr is where the operator console and its admin API listen (host:port, port 0
	// picks one); the demo prints the console's URL. Defaults to "" (no console); the demo
	// command's --console-addr defaults to DefaultConsoleAddr.
	ConsoleAddr string
	// Keep leaves the pipeline and the console running after the report, until ctx ends
	// (Ctrl-C), so the console can be explored. Defaults to false.
	Keep bool
	// Logger receives the components' logs. Defaults to a logger that discards them.
	Logger *slog.Logger
}

func (c *Config) applyDefaults() {
	if c.Orders == 0 {
		c.Orders = DefaultOrders
	}
	if c.Customers == 0 {
		c.Customers = DefaultCustomers
	}
	if c.Producers == 0 {
		c.Producers = DefaultProducers
	}
	if c.Duplicates == 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.Duplicates < 0 {
		c.Duplicates = 0
	}
	if c.Duplicates > c.Orders {
		c.Duplicates = c.Orders
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = DefaultDatabaseURL
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Topic == "" {
		c.Topic = DefaultTopic
		if len(c.Brokers) > 0 {
			// A real broker keeps earlier runs' records; a fresh topic keeps the counts exact.
			c.Topic += "." + strconv.FormatInt(time.Now().UnixNano(), 36)
		}
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.Orders < 0 {
		errs = append(errs, fmt.Errorf("-n must be positive, got %d", c.Orders))
	}
	if c.Customers < 0 {
		errs = append(errs, fmt.Errorf("--customers must be positive, got %d", c.Customers))
	}
	if c.Producers < 0 {
		errs = append(errs, fmt.Errorf("--producers must be positive, got %d", c.Producers))
	}
	if c.Partitions < 0 {
		errs = append(errs, fmt.Errorf("--partitions must be positive, got %d", c.Partitions))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("--timeout must be positive, got %s", c.Timeout))
	}
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		errs = append(errs, fmt.Errorf("--schema: %w", err))
	}
	if c.SchemaRegistryURL != "" && !c.Avro {
		errs = append(errs, errors.New("--schema-registry needs --avro"))
	}
	return errors.Join(errs...)
}

// Run runs the demo and returns its report. Progress goes to out while it runs, the table at
// the end. An error means the demo could not run (database unreachable, broker down); a run
// that completed but broke an invariant returns a report whose OK is false.
func Run(ctx context.Context, cfg Config, out io.Writer) (*Report, error) {
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	progress := out
	if cfg.Quiet {
		progress = io.Discard
	}

	pool, err := setupDatabase(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	fmt.Fprintf(progress, "postgres  %s (schema %s, recreated)\n", redact(cfg.DatabaseURL), cfg.Schema)

	brokers := cfg.Brokers
	if len(brokers) == 0 {
		kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
		if err != nil {
			return nil, fmt.Errorf("start the embedded Kafka broker: %w", err)
		}
		defer kc.Close()
		brokers = kc.ListenAddrs()
		fmt.Fprintf(progress, "kafka     embedded broker at %s (attach with: kcat -b %s -L)\n", brokers[0], brokers[0])
	} else {
		fmt.Fprintf(progress, "kafka     %v\n", brokers)
	}
	if err := createTopics(ctx, brokers, cfg); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "topic     %s (%d partitions), dead letters to %s.dlq\n", cfg.Topic, cfg.Partitions, cfg.Topic)

	var codec payloadCodec = jsonPayload{}
	var decoder func(context.Context, *envelope.Event) error
	if cfg.Avro {
		url := cfg.SchemaRegistryURL
		if url == "" {
			reg := srfake.New()
			defer reg.Close()
			url = reg.URL()
			fmt.Fprintf(progress, "registry  embedded schema registry at %s\n", url)
		} else {
			fmt.Fprintf(progress, "registry  %s\n", url)
		}
		ac, dec, err := newAvroPayload(url)
		if err != nil {
			return nil, err
		}
		codec, decoder = ac, dec
	}

	ob, err := outbox.NewStore(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox store: %w", err)
	}
	orders, err := newOrders(cfg.Schema, ob, cfg.Topic, codec)
	if err != nil {
		return nil, err
	}

	relayClient, err := kgo.NewClient(append(outbox.ProducerOpts(), kgo.SeedBrokers(brokers...))...)
	if err != nil {
		return nil, fmt.Errorf("kafka client for the relay: %w", err)
	}
	defer relayClient.Close()
	relay, err := outbox.NewRelay(pool, relayClient, outbox.RelayConfig{
		Schema:              cfg.Schema,
		PollInterval:        200 * time.Millisecond,
		MaintenanceInterval: time.Second,
		Backoff:             keiro.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second},
		Logger:              cfg.Logger.With("component", "relay"),
	})
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	pay, err := newPayment(cfg.Schema, pool)
	if err != nil {
		return nil, fmt.Errorf("payment saga: %w", err)
	}
	saga, err := pay.inboxHandler()
	if err != nil {
		return nil, fmt.Errorf("payment saga: %w", err)
	}
	ship, err := newShipping(cfg.Schema, pool)
	if err != nil {
		return nil, fmt.Errorf("shipment workflow: %w", err)
	}
	shipStart := ship.inboxHandler()
	billing := billingHandler(cfg.Schema)
	consumer, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{
		Brokers:       brokers,
		Group:         ConsumerGroup,
		Topics:        []string{cfg.Topic},
		Store:         inbox.StoreConfig{Schema: cfg.Schema, Consumer: ConsumerGroup},
		SchemaDecoder: decoder,
		CommitEvery:   50,
		Logger:        cfg.Logger.With("component", "consumer"),
	}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		// The invoice, the payment saga's first step and the shipment workflow's start commit
		// with the inbox row.
		if err := billing(ctx, tx, ev); err != nil {
			return err
		}
		if err := saga(ctx, tx, ev); err != nil {
			return err
		}
		return shipStart(ctx, tx, ev)
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}

	if cfg.ConsoleAddr != "" {
		url, stop, err := serveConsole(ctx, cfg, pool, brokers)
		if err != nil {
			return nil, err
		}
		defer stop()
		fmt.Fprintf(out, "console   %s\n", url)
	}

	runCtx, stopComponents := context.WithCancel(ctx)
	defer stopComponents()
	var (
		wg      sync.WaitGroup
		errMu   sync.Mutex
		runErrs []error
	)
	start := func(name string, fn func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(runCtx); err != nil {
				errMu.Lock()
				runErrs = append(runErrs, fmt.Errorf("%s: %w", name, err))
				errMu.Unlock()
				stopComponents()
			}
		}()
	}
	start("relay", relay.Run)
	start("consumer", consumer.Run)
	start("workflow worker", func(ctx context.Context) error {
		if err := ship.worker.Run(ctx); ctx.Err() == nil {
			return err
		}
		return nil
	})
	for i, w := range pay.workers {
		start(fmt.Sprintf("timer worker %d", i+1), func(ctx context.Context) error {
			if err := w.Run(ctx); ctx.Err() == nil {
				return err
			}
			return nil
		})
	}

	// The orders context: Producers goroutines place the orders through the command runner.
	began := time.Now()
	var placed atomic.Int64
	producersDone := make(chan struct{})
	var next atomic.Int64
	var pwg sync.WaitGroup
	for p := range cfg.Producers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), uint64(began.UnixNano())))
			for {
				i := next.Add(1)
				if i > int64(cfg.Orders) {
					return
				}
				customer := fmt.Sprintf("c%03d", rng.IntN(cfg.Customers))
				cmd := PlaceOrder{OrderID: fmt.Sprintf("o%06d", i), Amount: 100 + rng.Int64N(9900)}
				if err := orders.place(runCtx, pool, customer, cmd); err != nil {
					if runCtx.Err() == nil {
						errMu.Lock()
						runErrs = append(runErrs, fmt.Errorf("place order %s: %w", cmd.OrderID, err))
						errMu.Unlock()
						stopComponents()
					}
					return
				}
				placed.Add(1)
			}
		}()
	}
	go func() { pwg.Wait(); close(producersDone) }()

	// Drive and report until everything drained (or the timeout, or an error).
	deadline := time.NewTimer(cfg.Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var (
		injected  int
		dupsReady = cfg.Duplicates == 0
		drained   bool
	)
	var lastProgress string
	printProgress := func() {
		rs, cs := relay.Stats(), consumer.Stats()
		line := fmt.Sprintf("placed %d/%d  published %d  consumed %d  duplicates suppressed %d",
			placed.Load(), cfg.Orders, rs.Published, cs.Processed+cs.Duplicates, cs.Duplicates)
		if line != lastProgress {
			lastProgress = line
			fmt.Fprintf(progress, "%6.1fs  %s\n", time.Since(began).Seconds(), line)
		}
	}
	pwgDone := false
loop:
	for {
		select {
		case <-runCtx.Done():
			break loop
		case <-deadline.C:
			printProgress()
			stopComponents()
			wg.Wait()
			return nil, fmt.Errorf("the pipeline did not drain within %s (raise --timeout, or run with -v to see the components' logs)", cfg.Timeout)
		case <-producersDone:
			producersDone = nil
			pwgDone = true
		case <-tick.C:
			printProgress()
		}
		rs, cs := relay.Stats(), consumer.Stats()
		if pwgDone && !dupsReady && rs.Published >= int64(cfg.Orders) {
			// Deliver some records a second time, byte for byte, as a broker redelivery or a
			// relay that died before marking would.
			n, err := redeliver(runCtx, brokers, cfg.Topic, cfg.Duplicates)
			if err != nil {
				stopComponents()
				wg.Wait()
				return nil, err
			}
			injected, dupsReady = n, true
			fmt.Fprintf(progress, "%6.1fs  delivered %d published records a second time\n", time.Since(began).Seconds(), n)
		}
		if pwgDone && dupsReady && cs.Processed >= placed.Load() && cs.Duplicates >= int64(injected) {
			drained = true
			printProgress()
			break loop
		}
	}
	pwg.Wait()
	var orderIDs []string
	if drained {
		// The payments context captures two orders in three; the saga's timers void the rest.
		for i := range placed.Load() {
			orderIDs = append(orderIDs, fmt.Sprintf("o%06d", i+1))
		}
		if err := settleSagas(runCtx, pool, pay, orderIDs, deadline.C); err != nil {
			stopComponents()
			wg.Wait()
			return nil, err
		}
		fmt.Fprintf(progress, "%6.1fs  payments captured, every payment timer fired\n", time.Since(began).Seconds())
		if err := ship.settle(runCtx, pool, len(orderIDs), deadline.C); err != nil {
			stopComponents()
			wg.Wait()
			return nil, err
		}
		fmt.Fprintf(progress, "%6.1fs  every shipment workflow ended\n", time.Since(began).Seconds())
	}
	keep := cfg.Keep && drained
	stop := func() {
		stopComponents()
		wg.Wait()
	}
	if !keep {
		stop()
	}
	elapsed := time.Since(began)
	errMu.Lock()
	runErr := errors.Join(runErrs...)
	errMu.Unlock()
	if runErr != nil {
		stop()
		return nil, runErr
	}
	if !drained {
		return nil, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}

	rep, err := verify(context.WithoutCancel(ctx), pool, cfg, orders.placedPerCustomer(), placed.Load(),
		int64(injected), relay.Stats(), consumer)
	if err != nil {
		stop()
		return nil, err
	}
	sagaChecks, err := pay.checks(context.WithoutCancel(ctx), pool, orderIDs)
	if err != nil {
		stop()
		return nil, fmt.Errorf("read the payment sagas: %w", err)
	}
	rep.Checks = append(rep.Checks, sagaChecks...)
	shipChecks, err := ship.checks(context.WithoutCancel(ctx), pool, len(orderIDs))
	if err != nil {
		stop()
		return nil, err
	}
	rep.Checks = append(rep.Checks, shipChecks...)
	rep.Elapsed = elapsed
	rep.Print(out)
	if keep {
		fmt.Fprintln(out, "\nkeeping the pipeline and the console up (--keep); press Ctrl-C to stop")
		<-runCtx.Done()
		stop()
	}
	return rep, nil
}

// settleSagas captures the payments of the orders that pay, then waits until every payment
// timer has fired (or the deadline).
func settleSagas(ctx context.Context, pool *pgxpool.Pool, pay *payment, orders []string, deadline <-chan time.Time) error {
	for _, o := range orders {
		if !pays(o) {
			continue
		}
		if err := pay.capture(ctx, pool, o); err != nil {
			return fmt.Errorf("capture the payment of %s: %w", o, err)
		}
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := pay.live(ctx, pool)
		if err != nil {
			return fmt.Errorf("count the payment timers: %w", err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("%d payment timers had not fired by the deadline (raise --timeout)", n)
		case <-tick.C:
		}
	}
}

// serveConsole serves the operator console over the demo's outbox, inbox and event store on
// cfg.ConsoleAddr, and returns its URL and the function that stops it.
func serveConsole(ctx context.Context, cfg Config, pool *pgxpool.Pool, brokers []string) (string, func(), error) {
	kcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return "", nil, fmt.Errorf("kafka client for the console: %w", err)
	}
	con, err := console.New(console.Config{
		Outbox: &console.OutboxConfig{Pool: pool, Schema: cfg.Schema},
		Inbox: &console.InboxConfig{Pool: pool, Schema: cfg.Schema, Consumer: ConsumerGroup,
			Handler: billingHandler(cfg.Schema), Kafka: kcl, Group: ConsumerGroup},
		Events: &console.EventsConfig{Pool: pool, Schema: cfg.Schema},
		Auth:   console.AuthConfig{AllowUnauthenticated: console.IsLoopback(cfg.ConsoleAddr)},
		Title:  "keiro demo",
		Logger: cfg.Logger.With("component", "console"),
	})
	if err != nil {
		kcl.Close()
		return "", nil, err
	}
	srv, err := httpserver.Listen(httpserver.Config{Addr: cfg.ConsoleAddr, Admin: con})
	if err != nil {
		kcl.Close()
		return "", nil, fmt.Errorf("serve the console (--console-addr): %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx) }()
	return "http://" + srv.Addr() + "/console/", func() {
		cancel()
		<-done //nolint:errcheck // Serve returns the cancellation just asked for
		kcl.Close()
	}, nil
}

// setupDatabase connects, recreates the demo schema, migrates it and creates the billing
// read model.
func setupDatabase(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse the database URL: %w", err)
	}
	if pcfg.MaxConns < 12 {
		pcfg.MaxConns = 12
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	err = func() error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			return fmt.Errorf("connect to PostgreSQL at %s (start it, or set DATABASE_URL): %w", redact(cfg.DatabaseURL), err)
		}
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+cfg.Schema+" CASCADE"); err != nil {
			return fmt.Errorf("drop the demo schema %s: %w", cfg.Schema, err)
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("acquire a connection to migrate: %w", err)
		}
		defer conn.Release()
		if err := migrations.Migrate(ctx, conn.Conn(), cfg.Schema); err != nil {
			return fmt.Errorf("migrate schema %s: %w", cfg.Schema, err)
		}
		if _, err := pool.Exec(ctx, billingDDL(cfg.Schema)); err != nil {
			return fmt.Errorf("create the billing read model: %w", err)
		}
		if _, err := pool.Exec(ctx, shippingDDL(cfg.Schema)); err != nil {
			return fmt.Errorf("create the shipping tables: %w", err)
		}
		return nil
	}()
	if err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

func createTopics(ctx context.Context, brokers []string, cfg Config) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("kafka admin client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, topic := range []string{cfg.Topic, cfg.Topic + ".dlq"} {
		resp, err := adm.CreateTopic(tctx, int32(cfg.Partitions), -1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s on %v (is the broker reachable?): %w", topic, brokers, err)
		}
	}
	return nil
}

// redeliver reads the first n records of topic and produces them again unchanged.
func redeliver(ctx context.Context, brokers []string, topic string, n int) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, fmt.Errorf("kafka client for redelivery: %w", err)
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollRecords(rctx, n-len(recs))
		if err := rctx.Err(); err != nil {
			return 0, fmt.Errorf("read records to redeliver: %w", err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			recs = append(recs, &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers})
		})
	}
	recs = recs[:n]
	if err := cl.ProduceSync(rctx, recs...).FirstErr(); err != nil {
		return 0, fmt.Errorf("redeliver records: %w", err)
	}
	return len(recs), nil
}
