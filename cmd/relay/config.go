package main

import (
	"context"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/kafkaconfig"
	"github.com/keiro-go/keiro/cmd/internal/schemacli"
	"github.com/keiro-go/keiro/cmd/internal/sidecar"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/httpserver"
	"github.com/keiro-go/keiro/outbox"
)

// EnvPrefix prefixes every flag's environment variable: --batch-size reads
// KEIRO_RELAY_BATCH_SIZE.
const EnvPrefix = "KEIRO_RELAY"

// Defaults of the relay's flags. The default:"…" tags read them through kong variables, so
// this is the one place they are set; the relay's come from the outbox library.
const (
	DefaultClientID            = "keiro-relay"
	DefaultPolicy              = "per-key" // outbox.PerKeyHeadOfLine
	DefaultBatchSize           = outbox.DefaultBatchSize
	DefaultMaxInFlight         = outbox.DefaultMaxInFlightBatches
	DefaultClaimConcurrency    = outbox.DefaultClaimConcurrency
	DefaultMaxAttempts         = outbox.DefaultMaxAttempts
	DefaultBackoffInitial      = outbox.DefaultBackoffInitial
	DefaultBackoffMax          = outbox.DefaultBackoffMax
	DefaultBackoffMultiplier   = outbox.DefaultBackoffMultiplier
	DefaultLease               = outbox.DefaultLease
	DefaultPollInterval        = outbox.DefaultPollInterval
	DefaultShutdownTimeout     = outbox.DefaultShutdownTimeout
	DefaultRetention           = outbox.DefaultRetention
	DefaultMaintenanceInterval = outbox.DefaultMaintenanceInterval
	DefaultVacuumThreshold     = outbox.DefaultVacuumThreshold
	DefaultHTTPAddr            = httpserver.DefaultAddr
	DefaultListLimit           = 100
)

// policies are the names --policy accepts (outbox.ParsePolicy).
var policies = []string{
	outbox.PerKeyHeadOfLine.String(), outbox.PerSourceStream.String(),
	outbox.StopTheLine.String(), outbox.BestEffort.String(),
}

const description = `keiro's outbox relay: publishes the rows of the PostgreSQL outbox table to Kafka, at least
once and in order per (source, key), and gives operators the tools to inspect and requeue dead
rows. Every flag can be set with the environment variable shown next to it; a flag on the command
line wins. "relay" alone runs the relay.`

// vars feeds the defaults above into the default:"${…}" tags.
func vars() kong.Vars {
	d := func(v time.Duration) string { return v.String() }
	return kong.Vars{
		"kafka_client_id":      DefaultClientID,
		"policy":               DefaultPolicy,
		"policies":             strings.Join(policies, ", "),
		"batch_size":           strconv.Itoa(DefaultBatchSize),
		"max_in_flight":        strconv.Itoa(DefaultMaxInFlight),
		"claim_concurrency":    strconv.Itoa(DefaultClaimConcurrency),
		"max_attempts":         strconv.Itoa(DefaultMaxAttempts),
		"backoff_initial":      d(DefaultBackoffInitial),
		"backoff_max":          d(DefaultBackoffMax),
		"backoff_multiplier":   strconv.FormatFloat(DefaultBackoffMultiplier, 'g', -1, 64),
		"lease":                d(DefaultLease),
		"poll_interval":        d(DefaultPollInterval),
		"shutdown_timeout":     d(DefaultShutdownTimeout),
		"retention":            d(DefaultRetention),
		"maintenance_interval": d(DefaultMaintenanceInterval),
		"vacuum_threshold":     strconv.Itoa(DefaultVacuumThreshold),
		"http_addr":            DefaultHTTPAddr,
		"offsets_topic":        outbox.DefaultOffsetsTopic,
		"transaction_timeout":  d(outbox.DefaultTransactionTimeout),
		"transaction_linger":   d(outbox.DefaultTransactionLinger),
		"list_limit":           strconv.Itoa(DefaultListLimit),
	}
}

// relaySidecar describes the relay to the code it shares with the consumer.
var relaySidecar = &sidecar.Sidecar{
	Name:            "relay",
	Description:     description,
	EnvPrefix:       EnvPrefix,
	DefaultHTTPAddr: DefaultHTTPAddr,
	DatabaseURLHelp: " The password is never printed.",
	PgBouncerHelp:   ", polling only (implies --poll-only)",
	Options:         []kong.Option{vars()},
}

// app is the relay's command line.
func app() cli.App { return relaySidecar.App() }

// grammar is the command line: flags shared by every command, then the commands.
type grammar struct {
	Version      kong.VersionFlag `env:"-" help:"Print the version, commit and Go version, and exit."`
	cli.LogFlags `embed:""`
	DB           dbFlags `embed:""`

	Run         runCmd                 `cmd:"" default:"withargs" help:"Publish outbox rows to Kafka (the default command)."`
	Migrate     migrateCmd             `cmd:"" help:"Apply the embedded database migrations and print their status."`
	Status      statusCmd              `cmd:"" help:"Print outbox row counts per status and destination, the oldest pending age and dead rows."`
	Dead        deadCmd                `cmd:"" help:"List and requeue dead and rejected rows."`
	Events      eventsCmd              `cmd:"" help:"Inspect the event store: subscription dead letters (relay events dead --help)."`
	Rows        rowsCmd                `cmd:"" help:"List outbox rows by filter, or rows stuck in publishing."`
	Schema      schemaCmd              `cmd:"" help:"Register or check Avro schemas in the Schema Registry (relay schema --help)."`
	Mode        modeCmd                `cmd:"" help:"Show or switch the outbox's mode, claim or log, for every producer at once (relay mode --help)."`
	Healthcheck sidecar.HealthcheckCmd `cmd:"" help:"GET this relay's /readyz (or /healthz) and exit 0 when healthy, 1 otherwise (container healthchecks)."`
}

// schemaCmd hands its arguments to cmd/internal/schemacli. It is in the grammar for --help; run
// dispatches "relay schema …" before parsing, so the relay's database flags are not needed.
type schemaCmd struct {
	Args []string `arg:"" optional:"" passthrough:"" help:"register|check SUBJECT FILE.avsc and the registry flags."`
}

// Run runs the schema command (reached when relay flags precede "schema").
func (c *schemaCmd) Run(ctx context.Context, env *cli.Env) error {
	if code := schemacli.Run(ctx, c.Args, env.Stdout, env.Stderr); code != 0 {
		return &cli.ExitError{Code: code}
	}
	return nil
}

// run is the whole command line: it returns the process exit code. "relay schema …" goes to
// cmd/internal/schemacli before any flag is parsed, as the healthcheck does.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "schema" {
		return schemacli.Run(ctx, args[1:], stdout, stderr)
	}
	return relaySidecar.Run(ctx, &grammar{}, args, stdout, stderr)
}

// dbFlags locate the outbox table: the database flags both binaries share.
type dbFlags struct {
	sidecar.DB
}

// ValidateFlags reports a missing URL and a bad schema name.
func (f *dbFlags) ValidateFlags() error { return f.Validate(EnvPrefix) }

// runCmd publishes outbox rows until SIGINT/SIGTERM.
type runCmd struct {
	Kafka kafkaconfig.Config `embed:""`
	Admin cli.AdminFlags     `embed:""`

	Mode                   string        `help:"How the relay publishes: claim (claim and mark keiro_outbox's rows; works everywhere) or log (switch the schema to log mode and follow a logical replication slot in commit order; needs wal_level=logical and the REPLICATION attribute, not through PgBouncer)." default:"claim" placeholder:"MODE"`
	LogSlot                string        `help:"With --mode=log: the replication slot and publication (default: <schema>_keiro_log; with --destinations, <schema>_keiro_log_<hash of the set>)." placeholder:"SLOT"`
	LogUnknownTopicRetries int           `help:"With --mode=log: metadata refreshes a record of a topic Kafka does not know waits for before it is rejected (unknown_topic_or_partition); 0 uses the default (240, about a minute)."`
	ExactlyOnce            bool          `help:"Publish in Kafka transactions with the relay's progress (the slot position, or the claims published) in each, so read_committed readers see each event once across crashes, freezes and lost leases; a relay that takes over fences the one before. Needs transactions on the brokers and the transactional-id ACLs."`
	OffsetsTopic           string        `help:"With --exactly-once: the compacted topic of the relays' progress records (created if missing)." default:"${offsets_topic}" placeholder:"TOPIC"`
	InstanceID             string        `name:"instance-id" help:"With --exactly-once in claim mode: this relay's stable name among the schema's relays (a pod name); its transactional id is keiro-relay-claim.<schema>.<id>, and a restart with the same id fences its previous run at once (default: random per run)." placeholder:"ID"`
	TransactionTimeout     time.Duration `help:"With --exactly-once: the Kafka transaction timeout; an abandoned transaction is aborted by the broker after it (at most the brokers' transaction.max.timeout.ms)." default:"${transaction_timeout}"`
	TransactionLinger      time.Duration `help:"With --exactly-once: how long a transaction stays open for more records while they keep coming (more throughput, more latency); an idle relay commits at once." default:"${transaction_linger}"`
	Policy                 string        `help:"Ordering policy: ${policies}." default:"${policy}" placeholder:"POLICY"`
	BatchSize              int           `help:"Rows claimed per batch." default:"${batch_size}"`
	MaxInFlight            int           `help:"Claimed batches being published at once (per-key order is kept)." default:"${max_in_flight}"`
	ClaimConcurrency       int           `help:"Claim statements running at once (at most max-in-flight; per-key order is kept)." default:"${claim_concurrency}"`
	MaxAttempts            int           `help:"Publish attempts before a row goes dead." default:"${max_attempts}"`
	BackoffInitial         time.Duration `help:"First retry delay; doubles per attempt, with jitter." default:"${backoff_initial}"`
	BackoffMax             time.Duration `help:"Longest retry delay." default:"${backoff_max}"`
	BackoffMultiplier      float64       `help:"Growth of the retry delay per attempt (at least 1)." default:"${backoff_multiplier}"`
	Lease                  time.Duration `help:"How long a claim is owned before another relay may reclaim the row." default:"${lease}"`
	PollInterval           time.Duration `help:"Poll period; also the fallback when no NOTIFY arrives, and how often a claim scans the whole backlog." default:"${poll_interval}"`
	PollOnly               bool          `help:"Do not LISTEN for NOTIFY (for PgBouncer in transaction mode); poll only."`
	ShutdownTimeout        time.Duration `help:"On SIGTERM, how long in-flight rows may take to finish before they are released." default:"${shutdown_timeout}"`
	Retention              time.Duration `help:"How long sent rows are kept before deletion; 0 keeps them forever." default:"${retention}"`
	MaintenanceInterval    time.Duration `help:"Period of retention and gauges (one relay at a time)." default:"${maintenance_interval}"`
	VacuumThreshold        int64         `help:"Vacuum the outbox table once it holds this many dead row versions, without waiting for autovacuum (a deep backlog drains at full speed); needs the role to own the table; 0 never vacuums." default:"${vacuum_threshold}"`
	Destinations           []string      `help:"Only publish rows for these destinations (topics), comma separated (default: all). With --mode=log the relay follows a slot of its own that gets only these destinations' rows (PostgreSQL 15+), and refuses to start if another slot of the schema publishes one of them." placeholder:"TOPIC"`
	OrderedSources         []string      `help:"With --policy=per-source: declare these sources ordered streams at start (their producers then serialise per source, so their rows are published in commit order, null keys included), comma separated." placeholder:"SOURCE"`
	Migrate                bool          `help:"Apply database migrations before starting."`
	MaxRecordBytes         int           `help:"Largest record produced; larger rows are rejected (message_too_large). Set to the topic's max.message.bytes if lower; 0 uses the producer's batch limit."`
	HTTPAddr               string        `name:"http-addr" help:"Address of /healthz, /readyz, /metrics, the admin API (/api/v1/) and the console (/console/); empty disables." default:"${http_addr}" placeholder:"HOST:PORT"`
	CloudEvents            bool          `name:"cloudevents" help:"Also emit the CloudEvents binary-mode headers (ce_id, ce_source, ce_type, ce_specversion, ce_time, ce_partitionkey) on every record."`
	CloudEventsTopics      []string      `name:"cloudevents-destinations" help:"Emit the CloudEvents headers on the records of these destinations (topics) only, comma separated." placeholder:"TOPIC"`
	Compression            string        `help:"Compression of produced batches: none, gzip, snappy, lz4 or zstd (default: the producer's, snappy)." placeholder:"CODEC"`
	MaxBatchBytes          int32         `help:"Largest produce batch per partition in bytes; match the topics' max.message.bytes (0: the producer's default, about 1 MB). Records above it are rejected." placeholder:"BYTES"`
}

// compressionCodecs maps --compression to the producer's codec.
var compressionCodecs = map[string]kgo.CompressionCodec{
	"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
	"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
}

// ValidateFlags reports every problem of the run flags (the Kafka group reports its own).
func (c *runCmd) ValidateFlags() error {
	var p cli.Problems
	if _, err := outbox.ParseMode(c.Mode); err != nil {
		p.Add("mode", "unknown mode %q: use claim or log", c.Mode)
	}
	for i, d := range c.Destinations {
		if err := envelope.ValidateTopic(d); err != nil {
			p.Add("destinations", "entry %d %q %v", i+1, d, err)
		}
	}
	if c.LogSlot != "" && c.Mode != string(outbox.ModeLog) {
		p.Add("log-slot", "names the slot of --mode=log (got --mode=%s)", c.Mode)
	}
	if c.LogSlot != "" && !logSlotName.MatchString(c.LogSlot) {
		p.Add("log-slot", "%q must be 1 to 63 lower case letters, digits or underscores", c.LogSlot)
	}
	if !c.ExactlyOnce {
		if c.InstanceID != "" {
			p.Add("instance-id", "names the transactional id of --exactly-once, which is not set")
		}
	} else {
		if err := envelope.ValidateTopic(c.OffsetsTopic); err != nil {
			p.Add("offsets-topic", "%q %v", c.OffsetsTopic, err)
		}
		if c.TransactionTimeout < time.Second {
			p.Add("transaction-timeout", "must be at least 1s, got %s", c.TransactionTimeout)
		}
		if c.TransactionLinger < 0 {
			p.Add("transaction-linger", "must not be negative, got %s", c.TransactionLinger)
		}
	}
	if c.LogUnknownTopicRetries < 0 {
		p.Add("log-unknown-topic-retries", "must not be negative (0 means the default), got %d", c.LogUnknownTopicRetries)
	}
	if _, err := outbox.ParsePolicy(c.Policy); err != nil {
		p.Add("policy", "unknown policy %q: use %s", c.Policy, strings.Join(policies, ", "))
	}
	positive := func(flag string, v int) {
		if v < 1 {
			p.Add(flag, "must be at least 1, got %d", v)
		}
	}
	positive("batch-size", c.BatchSize)
	positive("max-in-flight", c.MaxInFlight)
	positive("claim-concurrency", c.ClaimConcurrency)
	positive("max-attempts", c.MaxAttempts)
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"backoff-initial", c.BackoffInitial}, {"backoff-max", c.BackoffMax}, {"lease", c.Lease},
		{"poll-interval", c.PollInterval}, {"shutdown-timeout", c.ShutdownTimeout},
		{"maintenance-interval", c.MaintenanceInterval},
	} {
		if d.v <= 0 {
			p.Add(d.flag, "must be positive, got %s", d.v)
		}
	}
	if c.BackoffMultiplier < 1 {
		p.Add("backoff-multiplier", "must be at least 1, got %g", c.BackoffMultiplier)
	}
	if c.Lease > 0 && c.Lease < time.Second {
		p.Add("lease", "must be at least 1s, got %s", c.Lease)
	}
	if c.VacuumThreshold < 0 {
		p.Add("vacuum-threshold", "must not be negative (0 never vacuums), got %d", c.VacuumThreshold)
	}
	if c.MaxRecordBytes < 0 {
		p.Add("max-record-bytes", "must not be negative (0 means the producer's limit), got %d", c.MaxRecordBytes)
	}
	if c.BackoffInitial > 0 && c.BackoffMax > 0 && c.BackoffMax < c.BackoffInitial {
		p.Add("backoff-max", "must be at least --backoff-initial (%s), got %s", c.BackoffInitial, c.BackoffMax)
	}
	if c.Retention < 0 {
		p.Add("retention", "must not be negative (0 keeps sent rows forever), got %s", c.Retention)
	}
	if len(c.OrderedSources) > 0 && c.Policy != outbox.PerSourceStream.String() {
		p.Add("ordered-sources", "declares per-source order, which only --policy=%s publishes (got --policy=%s)", outbox.PerSourceStream, c.Policy)
	}
	for _, src := range c.OrderedSources {
		if strings.TrimSpace(src) == "" || strings.TrimSpace(src) != src {
			p.Add("ordered-sources", "source %q is empty or has spaces around it (names are separated by commas alone)", src)
		}
	}
	for _, d := range c.Destinations {
		if err := envelope.ValidateTopic(d); err != nil {
			p.Add("destinations", "topic %q %v (names are separated by commas alone, no spaces)", d, err)
		}
	}
	for _, d := range c.CloudEventsTopics {
		if err := envelope.ValidateTopic(d); err != nil {
			p.Add("cloudevents-destinations", "topic %q %v (names are separated by commas alone, no spaces)", d, err)
		}
	}
	if _, ok := compressionCodecs[c.Compression]; c.Compression != "" && !ok {
		p.Add("compression", "unknown codec %q: use none, gzip, snappy, lz4 or zstd", c.Compression)
	}
	if c.MaxBatchBytes < 0 || (c.MaxBatchBytes > 0 && c.MaxBatchBytes < 1024) {
		p.Add("max-batch-bytes", "must be 0 (the producer's default) or at least 1024, got %d", c.MaxBatchBytes)
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			p.Add("http-addr", "%q is not host:port (empty disables the server)", c.HTTPAddr)
		}
	}
	return p.Err()
}

// logSlotName is what --log-slot may be (PostgreSQL's slot-name rule).
var logSlotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// modeCmd groups the mode commands.
type modeCmd struct {
	Show    modeShowCmd    `cmd:"" default:"1" help:"Print the schema's mode and, in log mode, its slot."`
	Set     modeSetCmd     `cmd:"" help:"Switch the schema's mode: log creates the slot first (needs the REPLICATION attribute); waits for running producers."`
	Prepare modePrepareCmd `cmd:"" help:"Create the slot and publication of a destination group's log-mode relays (--destinations) without switching: prepare every group before the switch, so that each slot holds every event of its destinations."`
	Recover modeRecoverCmd `cmd:"" help:"Republish the keiro_outbox_log events written in a time range (a lost slot's unconfirmed events): copies them into keiro_outbox for the relay's claim loop."`
}

// modeShowCmd prints the mode.
type modeShowCmd struct{}

// modeSetCmd switches the mode.
type modeSetCmd struct {
	Mode         string   `arg:"" enum:"claim,log" help:"claim or log."`
	LogSlot      string   `help:"The replication slot and publication of log mode (default: <schema>_keiro_log; with --destinations, <schema>_keiro_log_<hash of the set>)." placeholder:"SLOT"`
	Destinations []string `help:"With log: create the slot of the relays run with these --destinations (comma separated) instead of the slot of every destination." placeholder:"TOPIC"`
}

// modePrepareCmd creates a destination group's slot without switching.
type modePrepareCmd struct {
	LogSlot      string   `help:"The replication slot and publication (default: <schema>_keiro_log; with --destinations, <schema>_keiro_log_<hash of the set>)." placeholder:"SLOT"`
	Destinations []string `help:"The destinations (topics) of the group's relays, comma separated, as their --destinations (default: every destination)." placeholder:"TOPIC"`
}

// modeRecoverCmd republishes keiro_outbox_log's events of a time range.
type modeRecoverCmd struct {
	Since        string   `required:"" help:"The range's start: an RFC 3339 time, or a duration before now (2h)." placeholder:"TIME"`
	Until        string   `help:"The range's end, excluded: an RFC 3339 time or a duration before now (default: now)." placeholder:"TIME"`
	Destinations []string `help:"Only the events of these destinations (a per-destination relay's slot), comma separated (default: all)." placeholder:"TOPIC"`
}

// migrateCmd applies migrations.
type migrateCmd struct{}

// statusCmd prints the outbox's state.
type statusCmd struct {
	JSON bool `name:"json" help:"Print JSON instead of a table."`
}

// deadCmd groups the operator commands for dead and rejected rows.
type deadCmd struct {
	List    deadListCmd    `cmd:"" help:"List dead and rejected rows, oldest first."`
	Requeue deadRequeueCmd `cmd:"" help:"Make dead or rejected rows pending again (see the ordering warning it prints)."`
}

// deadListCmd lists dead rows.
type deadListCmd struct {
	Source      string `help:"Only rows of this source." placeholder:"SOURCE"`
	Destination string `help:"Only rows for this destination (topic)." placeholder:"TOPIC"`
	ListFlags   `embed:""`
}

// ListFlags are the flags every listing command shares: --limit and --json.
type ListFlags struct {
	Limit int  `help:"Most rows listed." default:"${list_limit}"`
	JSON  bool `name:"json" help:"Print JSON lines instead of a table."`
}

// ValidateFlags reports a bad limit.
func (f *ListFlags) ValidateFlags() error {
	var p cli.Problems
	if f.Limit < 1 {
		p.Add("limit", "must be at least 1, got %d", f.Limit)
	}
	return p.Err()
}

// deadRequeueCmd requeues dead rows by id, by source and/or destination, or all of them. Its
// selection and confirmation flags have no environment variable (env:"-"): a variable left in a
// shell or a pod spec must never select or confirm a requeue.
type deadRequeueCmd struct {
	IDs         []string `arg:"" optional:"" name:"id" help:"Outbox ids (UUIDs) of the rows to requeue."`
	Source      string   `env:"-" help:"Requeue every dead/rejected row of this source (and of --destination, if given)." placeholder:"SOURCE"`
	Destination string   `env:"-" help:"Requeue every dead/rejected row for this destination (topic) (and of --source, if given)." placeholder:"TOPIC"`
	All         bool     `env:"-" help:"Requeue every dead and rejected row (needs --yes). Command line only."`
	Yes         bool     `env:"-" help:"Confirm --all. Command line only."`
	DryRun      bool     `env:"-" name:"dry-run" help:"Print the rows that would be requeued and change nothing."`
}

// ValidateFlags requires exactly one way of selecting rows and well-formed ids.
func (c *deadRequeueCmd) ValidateFlags() error {
	var p cli.Problems
	modes := 0
	for _, on := range []bool{len(c.IDs) > 0, c.Source != "" || c.Destination != "", c.All} {
		if on {
			modes++
		}
	}
	switch {
	case modes == 0:
		p.Add("all", "say which rows: give outbox ids, --source and/or --destination, or --all --yes")
	case modes > 1:
		p.Add("all", "choose one of: outbox ids, --source/--destination, --all")
	}
	if c.All && !c.Yes && !c.DryRun {
		p.Add("yes", "--all requeues every dead row; add --yes to confirm (or --dry-run to see them)")
	}
	for _, id := range c.IDs {
		if _, err := envelope.ParseUUID(id); err != nil {
			p.Add("id", "%q is not a UUID", id)
		}
	}
	return p.Err()
}
