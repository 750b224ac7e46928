package keirotest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/outbox"
)

// Defaults of DrainOptions.
const (
	// DefaultDrainTimeout bounds how long DrainOutbox waits for the outbox to empty.
	DefaultDrainTimeout = 15 * time.Second
	// DefaultDrainPollInterval is the relay's poll interval while draining.
	DefaultDrainPollInterval = 50 * time.Millisecond
	// DefaultDrainBackoff is the first retry delay of a failed row while draining (it doubles
	// up to 20 times this), so a drain through a short outage is quick.
	DefaultDrainBackoff = 20 * time.Millisecond
)

// DrainOptions tunes DrainOutbox.
type DrainOptions struct {
	// Schema is the schema of the outbox. Defaults to the schema of the keiro_outbox table on
	// the pool's search_path (a NewDB pool's schema), else "keiro".
	Schema string
	// Timeout bounds the drain: if rows are still unpublished then, the test fails with the
	// list of them. Defaults to DefaultDrainTimeout.
	Timeout time.Duration
	// Relay configures the relay. Its Schema is replaced by the resolved schema; its
	// PollInterval defaults to DefaultDrainPollInterval, its Backoff to DefaultDrainBackoff
	// doubling up to 20 times that, its ShutdownTimeout to one second, and its Logger to one that writes warnings to t.Log. If
	// Relay.Destinations is set, only rows for those topics are drained. Defaults to those
	// values and the relay's own defaults.
	Relay outbox.RelayConfig
	// ClientOpts are added to the relay's producer options (outbox.ProducerOpts, the
	// broker's seeds and FastRetries). Defaults to none.
	ClientOpts []kgo.Opt
	// AllowUnpublished accepts rows that ended dead or rejected during the drain (for tests
	// of those paths). Defaults to false: such rows fail the test.
	AllowUnpublished bool
}

// DrainOutbox runs a real relay (outbox.Relay) against the outbox of pool, publishing to
// kafka, until no row is pending, failed or publishing, and returns the rows published while
// it ran (status sent, with their partitions and offsets; another relay on the same outbox
// would add its own), in outbox order. It fails t if the
// outbox is not empty within the timeout (listing the rows left and their last errors), if
// a row ended dead or rejected, or if the relay stopped with an error. At most one
// DrainOptions may be given.
func DrainOutbox(t testing.TB, pool *pgxpool.Pool, kafka *Kafka, opts ...DrainOptions) []outbox.Row {
	t.Helper()
	const who = "keirotest.DrainOutbox"
	if pool == nil || kafka == nil {
		t.Fatalf("%s: pool and kafka are required (got pool %v, kafka %v)", who, pool != nil, kafka != nil)
	}
	if len(opts) > 1 {
		t.Fatalf("%s: at most one DrainOptions may be given, got %d", who, len(opts))
	}
	var o DrainOptions
	if len(opts) == 1 {
		o = opts[0]
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultDrainTimeout
	}
	if o.Timeout < 0 {
		t.Fatalf("%s: DrainOptions.Timeout must be positive, got %s", who, o.Timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout+30*time.Second)
	defer cancel()
	schema, err := resolveSchema(ctx, pool, o.Schema)
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	cfg := o.Relay
	cfg.Schema = schema
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultDrainPollInterval
	}
	if cfg.Backoff.Initial == 0 {
		cfg.Backoff.Initial = DefaultDrainBackoff
	}
	if cfg.Backoff.Max == 0 {
		cfg.Backoff.Max = max(20*DefaultDrainBackoff, cfg.Backoff.Initial)
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	batches := make(chan struct{}, 1)
	userOnBatch := cfg.OnBatch
	cfg.OnBatch = func(b outbox.BatchResult) {
		if userOnBatch != nil {
			userOnBatch(b)
		}
		select {
		case batches <- struct{}{}:
		default:
		}
	}
	dests := cfg.Destinations
	if dests == nil {
		dests = []string{}
	}

	var start time.Time
	if err := pool.QueryRow(ctx, sqlNow).Scan(&start); err != nil {
		t.Fatalf("%s: read the database clock: %v", who, err)
	}
	copts := append(append(outbox.ProducerOpts(), kgo.SeedBrokers(kafka.Seeds...)), FastRetries()...)
	client, err := kgo.NewClient(append(copts, o.ClientOpts...)...)
	if err != nil {
		t.Fatalf("%s: create the relay's Kafka client: %v", who, err)
	}
	defer client.Close()
	relay, err := outbox.NewRelay(pool, client, cfg)
	if err != nil {
		t.Fatalf("%s: create the relay: %v", who, err)
	}
	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- relay.Run(runCtx) }()
	stopRelay := func() error {
		if stop == nil {
			return nil
		}
		stop()
		stop = nil
		return <-runErr
	}
	defer func() { _ = stopRelay() }() // also when t.Fatalf below ends the goroutine

	deadline := time.NewTimer(o.Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(cfg.PollInterval) // rows drained by another relay produce no batch here
	defer tick.Stop()
	countOpen := fmt.Sprintf(sqlCountOpen, schema)
	for {
		var open int64
		if err := pool.QueryRow(ctx, countOpen, dests).Scan(&open); err != nil {
			t.Fatalf("%s: count the unpublished rows of schema %q: %v", who, schema, err)
		}
		if open == 0 {
			break
		}
		select {
		case <-batches:
		case <-tick.C:
		case err := <-runErr:
			stop = nil
			t.Fatalf("%s: the relay stopped with %d rows left in the outbox of schema %q: %v", who, open, schema, err)
		case <-deadline.C:
			left, err := readRows(ctx, pool, schema, fmt.Sprintf(sqlOpenRows, schema), dests)
			if err != nil {
				t.Fatalf("%s: the outbox of schema %q still holds %d unpublished rows after %s (listing them failed: %v)",
					who, schema, open, o.Timeout, err)
			}
			t.Fatalf("%s: the outbox of schema %q still holds %s after %s.\n"+
				"  Is the broker refusing produces (Kafka.FailProduces), a topic missing (KafkaConfig.DisableAutoCreate),\n"+
				"  or a key held back behind a failing row? Unpublished rows:%s",
				who, schema, plural(len(left), "unpublished row"), o.Timeout,
				listing(len(left), func(i int) string { return rowLine(left[i]) }, nil))
		}
	}
	if err := stopRelay(); err != nil {
		t.Fatalf("%s: the relay stopped with an error: %v", who, err)
	}

	ended, err := readRows(ctx, pool, schema, fmt.Sprintf(sqlChangedSince, schema), start, []string{"dead", "rejected"})
	if err != nil {
		t.Fatalf("%s: list the rows that could not be published: %v", who, err)
	}
	if len(ended) > 0 && !o.AllowUnpublished {
		t.Fatalf("%s: %s could not be published and %s now dead or rejected (set DrainOptions.AllowUnpublished "+
			"if the test expects it):%s", who, plural(len(ended), "row"), verb(len(ended), "is", "are"),
			listing(len(ended), func(i int) string { return rowLine(ended[i]) }, nil))
	}
	sent, err := readRows(ctx, pool, schema, fmt.Sprintf(sqlChangedSince, schema), start, []string{"sent"})
	if err != nil {
		t.Fatalf("%s: list the published rows: %v", who, err)
	}
	return sent
}

// tWriter writes log lines to t.Log.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
