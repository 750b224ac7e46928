// Package logsource is what the relay and its log engine agree on: the engine's settings
// (Config, which exist only here), the Engine it returns, and the Factory that
// outbox/logrelay provides. It does not link the logical replication client: a relay in
// claim mode imports it without the engine.
package logsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/schemaname"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
	"github.com/keiro-go/keiro/outbox/internal/logslot"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// Defaults applied by Config.WithDefaults.
const (
	// DefaultSchema is the schema that holds keiro_outbox_log.
	DefaultSchema = schemaname.Default
	// DefaultMaxInFlightRecords bounds the records produced and not yet acknowledged; past it
	// the engine stops reading the slot. It is below the producer's MaxBufferedRecords
	// (franz-go refuses a record past that bound under manual flushing), and as many rows as
	// the claim relay keeps between claim and mark (4 batches of 512): a record in flight
	// keeps about 2 KiB of heap for 1 KiB of payload, which the collector's target multiplies
	// (GOGC), and 16,384 of them raised the relay binary's peak RSS by 10-30 MiB with no
	// gain in drain rate (docs/benchmarks-history.md).
	DefaultMaxInFlightRecords = 2048
	// DefaultMaxInFlightBytes bounds the bytes of the records in flight (key, value and
	// headers); past it the engine stops reading the slot.
	DefaultMaxInFlightBytes = 32 << 20
	// DefaultUnknownTopicRetries bounds the metadata refreshes a record of a topic Kafka
	// does not know waits for before it is rejected: about a minute with the relay's
	// ProducerOpts (metadata at most 250 ms old).
	DefaultUnknownTopicRetries = 240
	// DefaultStatusInterval is how often the engine reports its confirmed position to
	// PostgreSQL when the server does not ask sooner; well inside the server's
	// wal_sender_timeout (60 s by default).
	DefaultStatusInterval = 5 * time.Second
	// DefaultStandbyRetry is how often a standby engine tries to take the slot over.
	DefaultStandbyRetry = time.Second
	// DefaultRetryBackoff is the wait before a new session after one failed (PostgreSQL
	// lost, a produce that failed after the producer's own retries).
	DefaultRetryBackoff = time.Second
	// DefaultShutdownTimeout bounds how long Run waits, once its context is cancelled, for
	// the records in flight before it confirms what was acknowledged and returns.
	DefaultShutdownTimeout = 10 * time.Second
)

// Config configures a log engine: the relay builds it from its RelayConfig, and the engine
// uses it as it is. The records themselves (their size, headers, dead letters) are the
// publisher's. The zero value is usable: every field has a default.
type Config struct {
	// Schema is the schema of the keiro_outbox_log table (migration 009_outbox_log.sql).
	// Defaults to DefaultSchema.
	Schema string
	// Slot is the logical replication slot the engine follows; created (pgoutput) when it
	// does not exist. Engines sharing a slot elect one active reader: the others wait.
	// Defaults to logslot.Name(Schema, Destinations): "<Schema>_keiro_log" for every
	// destination.
	Slot string
	// Publication is the publication of keiro_outbox_log's inserts the slot decodes;
	// created when it does not exist. Defaults to Slot.
	Publication string
	// Destinations, if set, restricts the engine to the records of these destinations
	// (topics): the publication it creates has a row filter (PostgreSQL 15 or later) that
	// gives the slot only their rows, an existing publication must have the same set, and the
	// engine skips any other record it decodes (confirming its transaction all the same).
	// Defaults to every destination.
	Destinations []string
	// MaxInFlightRecords bounds the records produced and not yet acknowledged by Kafka.
	// Defaults to DefaultMaxInFlightRecords.
	MaxInFlightRecords int
	// MaxInFlightBytes bounds the bytes of those records. Defaults to
	// DefaultMaxInFlightBytes.
	MaxInFlightBytes int
	// UnknownTopicRetries bounds how long a record of a topic Kafka does not know waits for
	// the topic: franz-go looks for it again at each metadata refresh (at most the client's
	// MetadataMinAge apart), and after this many fails the topic's waiting records, which
	// are rejected (code unknown_topic_or_partition, through the publisher's DeadLetter) and the stream moves
	// on. Their transactions are not confirmed before. Defaults to
	// DefaultUnknownTopicRetries.
	UnknownTopicRetries int
	// StatusInterval is how often the confirmed position is reported to PostgreSQL.
	// Defaults to DefaultStatusInterval.
	StatusInterval time.Duration
	// StandbyRetry is how often an engine that found the slot active elsewhere tries
	// again. Defaults to DefaultStandbyRetry.
	StandbyRetry time.Duration
	// RetryBackoff is the wait before a new session after a failed one. Defaults to
	// DefaultRetryBackoff.
	RetryBackoff time.Duration
	// ShutdownTimeout bounds the wait for records in flight once Run's context is
	// cancelled. Defaults to DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// ExactlyOnce, if set, publishes in Kafka transactions with the slot's position in each
	// (exactlyonce.Config; the engine sets its TransactionalID from the slot). nil: at
	// least once.
	ExactlyOnce *exactlyonce.Config
	// ApplicationName names the replication session (its walsender) in pg_stat_activity
	// and pg_stat_replication, as the relay process's other sessions are named. Empty: the
	// connection string's application_name, if any.
	ApplicationName string
	// Logger receives the engine's logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns cfg with every unset field set to its default.
func (cfg Config) WithDefaults() Config {
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if cfg.Slot == "" {
		cfg.Slot = logslot.Name(cfg.Schema, cfg.Destinations)
	}
	if cfg.Publication == "" {
		cfg.Publication = cfg.Slot
	}
	cfg.Destinations = logslot.Normalize(cfg.Destinations)
	if cfg.MaxInFlightRecords == 0 {
		cfg.MaxInFlightRecords = DefaultMaxInFlightRecords
	}
	if cfg.MaxInFlightBytes == 0 {
		cfg.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	if cfg.StandbyRetry == 0 {
		cfg.StandbyRetry = DefaultStandbyRetry
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = DefaultRetryBackoff
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.UnknownTopicRetries == 0 {
		cfg.UnknownTopicRetries = DefaultUnknownTopicRetries
	}
	if cfg.ExactlyOnce != nil {
		eo := cfg.ExactlyOnce.WithDefaults()
		cfg.ExactlyOnce = &eo
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Validate reports every problem of a defaulted configuration at once.
func (cfg Config) Validate() error {
	var errs []error
	if err := schemaname.Validate(cfg.Schema); err != nil {
		errs = append(errs, fmt.Errorf("Schema: %w", err))
	}
	if !logslot.ValidName(cfg.Slot) {
		errs = append(errs, fmt.Errorf("Slot %q: must be 1 to 63 lower case letters, digits or underscores (set Slot when the schema name is too long for the default)", cfg.Slot))
	}
	if !logslot.ValidName(cfg.Publication) {
		errs = append(errs, fmt.Errorf("Publication %q: must be 1 to 63 lower case letters, digits or underscores", cfg.Publication))
	}
	for i, d := range cfg.Destinations {
		if err := envelope.ValidateTopic(d); err != nil {
			errs = append(errs, fmt.Errorf("Destinations[%d] %q %w", i, d, err))
		}
	}
	positive := func(name string, v int) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %d", name, v))
		}
	}
	positive("MaxInFlightRecords", cfg.MaxInFlightRecords)
	positive("MaxInFlightBytes", cfg.MaxInFlightBytes)
	positive("UnknownTopicRetries", cfg.UnknownTopicRetries)
	for _, d := range []struct {
		name string
		d    time.Duration
	}{
		{"StatusInterval", cfg.StatusInterval}, {"StandbyRetry", cfg.StandbyRetry},
		{"RetryBackoff", cfg.RetryBackoff}, {"ShutdownTimeout", cfg.ShutdownTimeout},
	} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", d.name, d.d))
		}
	}
	return errors.Join(errs...)
}

// Engine is a running log engine, as the relay sees it.
type Engine interface {
	// Run follows the slot until ctx ends.
	Run(ctx context.Context) error
	// Published counts the records Kafka acknowledged.
	Published() int64
	// Sessions counts the sessions that started replicating.
	Sessions() int64
	// ExactlyOnce returns, under ExactlyOnce, the engine's transactional id (empty until it
	// first held the slot) and the counters of its Kafka transactions; "" and nil at least
	// once.
	ExactlyOnce() (txnID string, counters *exactlyonce.Counters)
}

// Factory builds a log engine that reads the slot of cfg on the database of connString (the
// engine adds replication=database) and publishes through pub.
type Factory func(connString string, pub *publish.Publisher, cfg Config) (Engine, error)
