package outbox

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/schemaname"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
)

// Defaults of RelayConfig.
const (
	// DefaultBatchSize is 512 rows per claim. keiro uses 32; one claim, one produce flush and one
	// mark statement cost about the same for 32 rows as for 512, so larger batches amortise
	// the round trips (see BENCHMARKS.md "Relay"), while 512 rows of 1 KiB stay well under a
	// Kafka request.
	DefaultBatchSize = 512
	// DefaultMaxInFlightBatches is 4 claimed batches between claim and mark at once.
	DefaultMaxInFlightBatches = 4
	// DefaultClaimConcurrency is 1 claim statement at a time per relay. Concurrent claims start
	// at the same front of the backlog and race for its rows: each looks up the heads of, and
	// tries to lock, rows the other is taking, so about half of a claim's work was wasted and two
	// claimers drained slower than one (200k rows over 10k keys: 35-36k against 40-46k msgs/s on
	// the 2-core reference machine; over 1k keys 15-20k against 31k; a hot key 340-370 against
	// 233 ms). A host with idle cores and a claim-bound relay may gain from 2.
	DefaultClaimConcurrency = 1
	// DefaultMaxAttempts is keiro's 10 attempts before a row goes dead.
	DefaultMaxAttempts = 10
	// DefaultLogUnknownTopicRetries is ModeLog's bound on the metadata refreshes a record of
	// a topic Kafka does not know waits for before it is rejected (RelayConfig.
	// LogUnknownTopicRetries): about a minute with ProducerOpts' DefaultMetadataMinAge.
	DefaultLogUnknownTopicRetries = logsource.DefaultUnknownTopicRetries
	// DefaultBackoffInitial is the first retry delay.
	DefaultBackoffInitial = time.Second
	// DefaultBackoffMax caps the retry delay.
	DefaultBackoffMax = 5 * time.Minute
	// DefaultBackoffMultiplier grows the delay per attempt.
	DefaultBackoffMultiplier = 2.0
	// DefaultLease is how long a claim is exclusive before another relay may take it over.
	DefaultLease = time.Minute
	// DefaultPollInterval is how often the relay claims without a notification.
	DefaultPollInterval = time.Second
	// DefaultShutdownTimeout bounds the wait for in-flight produces on shutdown.
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultRetention keeps sent rows for a day (for inspection and lookups) before deletion.
	DefaultRetention = 24 * time.Hour
	// DefaultRetentionBatch deletes sent rows 1000 per statement, so no lock is held long.
	DefaultRetentionBatch = 1000
	// DefaultVacuumThreshold is the number of dead row versions (or of rows inserted since the
	// last vacuum) in the outbox table at which a relay whose backlog is deep vacuums it
	// (RelayConfig.VacuumThreshold).
	DefaultVacuumThreshold = 100_000
	// DefaultMaintenanceInterval is how often retention and gauge sampling run.
	DefaultMaintenanceInterval = 30 * time.Second
	// DefaultOffsetsTopic is ExactlyOnce's topic of progress records: "keiro-relay-offsets".
	DefaultOffsetsTopic = exactlyonce.DefaultOffsetsTopic
	// DefaultTransactionTimeout is ExactlyOnce's Kafka transaction timeout: a minute.
	DefaultTransactionTimeout = exactlyonce.DefaultTransactionTimeout
	// DefaultTransactionLinger is how long an ExactlyOnce transaction stays open for more
	// records: 10ms.
	DefaultTransactionLinger = exactlyonce.DefaultLinger
)

// RelayConfig configures a Relay. The zero value is valid: every field has a default.
type RelayConfig struct {
	// Schema is the PostgreSQL schema holding keiro_outbox. Defaults to DefaultSchema ("keiro").
	Schema string
	// Policy is the ordering policy. Defaults to PerKeyHeadOfLine.
	Policy Policy
	// BatchSize is the most rows one claim takes. Defaults to DefaultBatchSize.
	BatchSize int
	// MaxInFlightBatches is how many claimed batches may be between claim and mark at once
	// (claiming, producing and marking overlap). Per-key order holds regardless: a key with a
	// row in flight is not claimable. StopTheLine always uses 1. Defaults to
	// DefaultMaxInFlightBatches.
	MaxInFlightBatches int
	// ClaimConcurrency is how many claims may run at once while the outbox is backlogged (the
	// last claim was full; in a steady trickle one claimer answers), each taking a free
	// in-flight slot (it is capped at MaxInFlightBatches). Concurrent claims never share a row or break a
	// key's order (the claim locks with SKIP LOCKED and drops a key's rows after one it could
	// not take), exactly as several relays on one table. StopTheLine always uses 1. Defaults to
	// DefaultClaimConcurrency.
	ClaimConcurrency int
	// MaxAttempts is the number of attempts before a failing row goes dead. Failures while
	// Kafka is unreachable do not use attempts (see the package doc). Defaults to
	// DefaultMaxAttempts.
	MaxAttempts int
	// Backoff spaces the retries of a failed row. Defaults to the Default* backoff constants.
	Backoff keiro.Backoff
	// Lease is how long a claim stays exclusive. A row still publishing when its lease expires
	// (its relay died or lost PostgreSQL) is claimed again by any relay. A live relay renews
	// the lease of a batch still in flight after a third of it, so Lease bounds how long a dead
	// relay's rows wait, not how long a produce may take. Defaults to DefaultLease.
	Lease time.Duration
	// PollInterval is how often the relay claims when no notification arrives. It is also how
	// often a claim scans the whole backlog (and such scans repeat while they come back full):
	// other claims look only MaxInFlightBatches × BatchSize open rows deep, so a row behind a
	// front of blocked keys (in backoff) waits up to one interval. Defaults to
	// DefaultPollInterval.
	PollInterval time.Duration
	// PollOnly disables LISTEN/NOTIFY (needed behind PgBouncer in transaction mode): the relay
	// then only polls. Defaults to false.
	PollOnly bool
	// ShutdownTimeout bounds how long Run waits for in-flight produces after its context is
	// cancelled; rows still claimed then are released. Defaults to DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Retention is how long sent rows are kept; negative keeps them forever. In ModeLog it also
	// applies to keiro_outbox_log: a row is deleted once older than Retention and confirmed by
	// the slot (docs/architecture.md, "Retention of keiro_outbox_log"). Defaults to
	// DefaultRetention.
	Retention time.Duration
	// RetentionBatch is the most sent rows one retention statement deletes. Defaults to
	// DefaultRetentionBatch.
	RetentionBatch int
	// MaintenanceInterval is how often the maintenance pass (retention, gauges) runs; one
	// relay at a time does it. Defaults to DefaultMaintenanceInterval.
	MaintenanceInterval time.Duration
	// VacuumThreshold is the number of dead row versions (or of rows inserted since the last
	// vacuum) in the outbox table at which the relay, while its backlog is deep, vacuums and
	// analyzes the table itself, without waiting for autovacuum: every published row
	// leaves dead index entries in front of its key's head, which a deep backlog's claims
	// step over until a vacuum removes them (see "Deep backlogs" in the package doc). It needs the relay's role to own
	// the table; otherwise the relay logs that once and leaves the table to autovacuum.
	// Negative disables it. Defaults to DefaultVacuumThreshold.
	VacuumThreshold int64
	// MaxRecordBytes is the largest record (key, value and headers) the relay produces; a
	// larger row is rejected with code message_too_large before it reaches Kafka. Set it to
	// the topic's max.message.bytes if that is lower. Defaults to the client's
	// ProducerBatchMaxBytes.
	MaxRecordBytes int
	// Destinations, if set, restricts the relay to rows for these topics (other rows are left
	// to other relays). Relays with the same Destinations, in any order, split the claim shares
	// of a deep backlog between them; relays with other Destinations never take part in their
	// split (see "Several relays" in the package doc). In ModeLog the relay follows a slot of
	// its own (LogSlot defaults to LogSlotFor(Schema, Destinations)), whose publication gives
	// it only these destinations' rows (PostgreSQL 15 or later); relays with the same set share
	// it, and a relay refuses to start when another log-mode slot of the schema publishes one of
	// its destinations (ErrLogSlotOverlap; a relay without Destinations publishes them all).
	// Defaults to all topics.
	Destinations []string
	// CloudEvents makes every record also carry the CloudEvents binary-mode headers (ce_id,
	// ce_source, ce_type, ce_specversion, ce_time, ce_partitionkey) after keiro's, so that
	// CloudEvents consumers read keiro's records. Defaults to false.
	CloudEvents bool
	// CloudEventsDestinations adds the CloudEvents headers to the records of these topics only
	// (CloudEvents true means every topic). Defaults to none.
	CloudEventsDestinations []string
	// MeterProvider provides the "keiro" meter. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider provides the "keiro" tracer. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Mode is how the relay publishes (docs/architecture.md, "Log mode"). ModeClaim claims
	// and marks keiro_outbox's rows. ModeLog switches the schema to log mode if it is not
	// (Admin.SetMode: producers then write keiro_outbox_log), publishes the rows still open in
	// keiro_outbox as ModeClaim does, and then follows the replication slot LogSlot in commit
	// order; the pool's role needs the REPLICATION attribute and the server wal_level =
	// logical. A record Kafka refuses for good is written as a rejected row of keiro_outbox
	// (ListDead, Requeue) before its transaction is confirmed, and the claim loop keeps
	// running beside the slot to publish requeued ones. Several relays in log mode elect one
	// reader per slot; the others wait on standby. Defaults to ModeClaim.
	Mode Mode
	// LogEngine is the log engine of ModeLog: set it to logrelay.Engine (package
	// github.com/keiro-go/keiro/outbox/logrelay, which links the logical replication client
	// that a relay in ModeClaim goes without). Required in ModeLog. Defaults to nil.
	LogEngine logsource.Factory
	// LogSlot is the replication slot (and publication) of ModeLog. Defaults to
	// LogSlotFor(Schema, Destinations): DefaultLogSlot(Schema) without Destinations.
	LogSlot string
	// LogUnknownTopicRetries bounds, in ModeLog, how long a record of a topic Kafka does not
	// know waits for the topic: franz-go looks for it again at each metadata refresh (at most
	// DefaultMetadataMinAge apart with ProducerOpts), and after this many it fails the
	// topic's waiting records, which are rejected with code unknown_topic_or_partition
	// (rejected rows of keiro_outbox: `relay dead requeue` them once the topic exists) and
	// the slot moves on. Meanwhile the slot is not confirmed past them. It is log mode's
	// counterpart of claim mode's attempts, where the row dies after MaxAttempts.
	// Defaults to DefaultLogUnknownTopicRetries.
	LogUnknownTopicRetries int
	// ExactlyOnce publishes in Kafka transactions, so that a reader with isolation level
	// read_committed sees each event once even when a relay dies, freezes or loses its
	// lease mid-batch (docs/architecture.md, "Exactly-once publication"). Each transaction
	// also writes the relay's progress to OffsetsTopic: in ModeLog the slot position it
	// holds, in ModeClaim the claims whose rows it published. The transactional id is
	// derived from what the relay owns (ModeLog: the slot; ModeClaim: InstanceID), so a
	// relay that takes over fences the one before. The producer's role needs the
	// transactional-id WRITE and DESCRIBE ACLs, and the brokers transactions (see
	// docs/operations.md). Defaults to false: at least once.
	ExactlyOnce bool
	// OffsetsTopic is ExactlyOnce's compacted topic of progress records, created (one
	// partition, compacted) if it does not exist. Defaults to DefaultOffsetsTopic.
	OffsetsTopic string
	// InstanceID names this relay among the schema's claim relays under ExactlyOnce: its
	// transactional id is "keiro-relay-claim.<Schema>.<InstanceID>". A relay restarted with
	// the same id fences its previous run at once; without one each Run takes a random id,
	// and its claims' rows are fenced by whichever relay takes them over once their lease
	// expires. Use a stable id per replica (a StatefulSet's pod name). Defaults to random.
	InstanceID string
	// TransactionTimeout is ExactlyOnce's Kafka transaction timeout: a transaction its relay
	// neither committed nor aborted within it is aborted by the broker, and read_committed
	// readers of its partitions wait for it meanwhile. At most the brokers'
	// transaction.max.timeout.ms. Defaults to DefaultTransactionTimeout.
	TransactionTimeout time.Duration
	// TransactionLinger is how long an ExactlyOnce transaction stays open for more records
	// while they keep coming; an idle relay commits at once. Longer transactions commit less
	// often (more throughput) and hold records from readers longer (more latency).
	// Defaults to DefaultTransactionLinger.
	TransactionLinger time.Duration
	// OnBatch, if set, is called after each batch is marked, with what happened. It runs on the
	// relay's goroutine: keep it fast. Meant for tests and diagnostics. Defaults to nil.
	OnBatch func(BatchResult)
}

// BatchResult reports one marked batch (rows actually transitioned).
type BatchResult struct {
	// Claimed is the number of rows claimed.
	Claimed int
	// Published, Retried, Skipped, Dead, Rejected and Released count rows moved to sent,
	// failed, failed-with-refund, dead, rejected and pending.
	Published, Retried, Skipped, Dead, Rejected, Released int
	// Reclaimed counts rows taken over from an expired lease.
	Reclaimed int
	// HaltedOn is the outbox id of the row that halted a StopTheLine relay, if any.
	HaltedOn *string
	// OrderBroken counts rows Kafka acknowledged after an earlier row of their key in the same
	// flush failed: the key is out of order on the topic. franz-go fails every later record of
	// a partition once one fails, so this should stay 0; the relay logs each at error level
	// and counts them in keiro.outbox.order_broken.
	OrderBroken int
}

func (c *RelayConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxInFlightBatches == 0 {
		c.MaxInFlightBatches = DefaultMaxInFlightBatches
	}
	if c.ClaimConcurrency == 0 {
		c.ClaimConcurrency = DefaultClaimConcurrency
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	c.Backoff = c.Backoff.WithDefaults(keiro.Backoff{Initial: DefaultBackoffInitial, Max: DefaultBackoffMax, Multiplier: DefaultBackoffMultiplier})
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Mode == "" {
		c.Mode = ModeClaim
	}
	if c.Mode == ModeLog && c.LogSlot == "" {
		c.LogSlot = LogSlotFor(c.Schema, c.Destinations)
	}
	if c.LogUnknownTopicRetries == 0 {
		c.LogUnknownTopicRetries = DefaultLogUnknownTopicRetries
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.RetentionBatch == 0 {
		c.RetentionBatch = DefaultRetentionBatch
	}
	if c.MaintenanceInterval == 0 {
		c.MaintenanceInterval = DefaultMaintenanceInterval
	}
	if c.VacuumThreshold == 0 {
		c.VacuumThreshold = DefaultVacuumThreshold
	}
	if c.OffsetsTopic == "" {
		c.OffsetsTopic = DefaultOffsetsTopic
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	if c.TransactionLinger == 0 {
		c.TransactionLinger = DefaultTransactionLinger
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// exactlyOnce is the engines' exactly-once configuration, with new counters: nil without
// ExactlyOnce. The transactional id is each engine's to set.
func (c *RelayConfig) exactlyOnce() *exactlyonce.Config {
	if !c.ExactlyOnce {
		return nil
	}
	eo := exactlyonce.Config{OffsetsTopic: c.OffsetsTopic, TransactionTimeout: c.TransactionTimeout,
		Linger: c.TransactionLinger}.WithDefaults()
	return &eo
}

// validate reports every problem with the (defaulted) config, each naming its field.
func (c *RelayConfig) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := schemaname.Validate(c.Schema); err != nil {
		bad("Schema: %w", err)
	}
	if !c.Policy.Valid() {
		bad("Policy: unknown policy %d", int(c.Policy))
	}
	if c.BatchSize < 1 {
		bad("BatchSize must be at least 1, got %d", c.BatchSize)
	}
	if c.MaxInFlightBatches < 1 {
		bad("MaxInFlightBatches must be at least 1, got %d", c.MaxInFlightBatches)
	}
	if c.ClaimConcurrency < 1 {
		bad("ClaimConcurrency must be at least 1, got %d", c.ClaimConcurrency)
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts must be at least 1, got %d", c.MaxAttempts)
	}
	if c.Backoff.Initial < 0 {
		bad("Backoff.Initial must be positive, got %s", c.Backoff.Initial)
	}
	if err := c.Backoff.Validate("Backoff"); err != nil {
		errs = append(errs, err)
	}
	if c.Lease < time.Second {
		bad("Lease must be at least 1s, got %s", c.Lease)
	}
	if _, err := ParseMode(string(c.Mode)); err != nil {
		bad("Mode: %v", err)
	}
	if c.LogSlot != "" && c.Mode != ModeLog {
		bad("LogSlot %q is set but Mode is %s; set Mode to %s or leave LogSlot empty", c.LogSlot, c.Mode, ModeLog)
	}
	if c.Mode == ModeLog && c.LogEngine == nil {
		bad("LogEngine is nil but Mode is %s; set it to logrelay.Engine (github.com/keiro-go/keiro/outbox/logrelay)", ModeLog)
	}
	if c.LogUnknownTopicRetries < 0 {
		bad("LogUnknownTopicRetries must not be negative, got %d", c.LogUnknownTopicRetries)
	}
	if c.PollInterval < 0 {
		bad("PollInterval must be positive, got %s", c.PollInterval)
	}
	if c.ShutdownTimeout < 0 {
		bad("ShutdownTimeout must not be negative, got %s", c.ShutdownTimeout)
	}
	if c.RetentionBatch < 1 {
		bad("RetentionBatch must be at least 1, got %d", c.RetentionBatch)
	}
	if c.MaintenanceInterval < 0 {
		bad("MaintenanceInterval must be positive, got %s", c.MaintenanceInterval)
	}
	if c.MaxRecordBytes < 0 {
		bad("MaxRecordBytes must not be negative, got %d", c.MaxRecordBytes)
	}
	for i, d := range c.Destinations {
		if err := envelope.ValidateTopic(d); err != nil {
			bad("Destinations[%d] %q %v", i, d, err)
		}
	}
	if c.ExactlyOnce {
		if err := envelope.ValidateTopic(c.OffsetsTopic); err != nil {
			bad("OffsetsTopic %q %v", c.OffsetsTopic, err)
		}
		if c.TransactionTimeout < time.Second {
			bad("TransactionTimeout must be at least 1s, got %s", c.TransactionTimeout)
		}
		if c.TransactionLinger < 0 {
			bad("TransactionLinger must not be negative, got %s", c.TransactionLinger)
		}
		if n := c.BatchSize * c.MaxInFlightBatches; n > maxExactlyOnceRowsInFlight {
			// Each transaction's claims record lists the seq of every row in flight.
			bad("BatchSize × MaxInFlightBatches (%d) must be at most %d with ExactlyOnce: the claims record of each transaction lists every row in flight",
				n, maxExactlyOnceRowsInFlight)
		}
		if c.InstanceID != "" && !validInstanceID(c.InstanceID) {
			bad("InstanceID %q must be 1 to 64 letters, digits, '.', '_' or '-'", c.InstanceID)
		}
	} else if c.InstanceID != "" {
		bad("InstanceID %q is set but ExactlyOnce is not; it names the relay's transactional id", c.InstanceID)
	}
	for i, d := range c.CloudEventsDestinations {
		if err := envelope.ValidateTopic(d); err != nil {
			bad("CloudEventsDestinations[%d] %q %v", i, d, err)
		}
	}
	return errors.Join(errs...)
}

// Policy is an ordering policy (keiro §1.3.6): what a claim must respect and how a failure in
// a batch affects the rows after it. Its String method returns its name ("per-key",
// "per-source", "stop-the-line" or "best-effort").
type Policy = claimsql.Policy

// The ordering policies.
const (
	// PerKeyHeadOfLine orders rows per (source, key): a row is claimed only when every earlier
	// non-terminal row of its (source, key) is claimed with it, and a failure holds back the
	// rest of its key. Rows without a key are unordered. The default.
	PerKeyHeadOfLine = claimsql.PerKeyHeadOfLine
	// PerSourceStream orders all rows of a source, whatever their key (null keys included).
	// Kafka itself orders only within a partition, so a total order needs a single-partition
	// destination. The order is commit order for sources declared with
	// [Admin.DeclarePerSourceOrder]; for others a transaction that commits late is published
	// after later rows of its source.
	PerSourceStream = claimsql.PerSourceStream
	// StopTheLine claims like PerKeyHeadOfLine with one batch in flight and publishes row by
	// row, a flush each (keiro §1.3.5): the first failure halts the relay, no later row of the
	// batch is sent (they are skipped, attempts refunded), and Run returns an error naming the
	// row, for manual review. The slowest policy: one produce round trip per row.
	StopTheLine = claimsql.StopTheLine
	// BestEffort claims every due row, unordered: a failure affects only its own row.
	BestEffort = claimsql.BestEffort
)

// ParsePolicy parses a policy name as returned by Policy.String.
func ParsePolicy(s string) (Policy, error) { return claimsql.ParsePolicy(s) }

// maxExactlyOnceRowsInFlight bounds the rows an ExactlyOnce claim relay has in flight: the
// claims record of its transactions lists each one's seq (about 10 bytes of JSON each), and
// must stay well below the 1 MB records brokers accept by default.
const maxExactlyOnceRowsInFlight = 65536

// validInstanceID reports whether id suits a transactional id: 1 to 64 letters, digits, '.',
// '_' or '-'.
func validInstanceID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}
