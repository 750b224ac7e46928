package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/sidecar"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/inbox/handlers"
)

// EnvPrefix prefixes every flag's environment variable: --group reads KEIRO_CONSUMER_GROUP.
const EnvPrefix = "KEIRO_CONSUMER"

// Defaults of the flags that have one (kept in sync with the default:"…" tags, which a test
// checks against --help).
const (
	DefaultHTTPTimeout = handlers.DefaultHTTPTimeout
	DefaultMaxAttempts = inbox.DefaultMaxAttempts
	// DefaultBatchSize 0 picks the handler mode's batch size: inbox.DefaultBatchSize in sql
	// mode, 1 in http mode.
	DefaultBatchSize       = 0
	DefaultBackoffInitial  = inbox.DefaultRetryInitial
	DefaultBackoffMax      = inbox.DefaultRetryMax
	DefaultConcurrency     = inbox.DefaultMaxConcurrentPartitions
	DefaultRetention       = inbox.DefaultRetention
	DefaultShutdownTimeout = inbox.DefaultShutdownTimeout
	DefaultDLQTopic        = inbox.DefaultDeadLetterTopic
	// DefaultHTTPAddr is loopback, one port above the relay's, so both fit on one host.
	DefaultHTTPAddr     = "127.0.0.1:9465"
	DefaultDedupePolicy = "message-id"
	// DefaultIsolationLevel reads committed records only (inbox.ReadCommitted).
	DefaultIsolationLevel = "read_committed"
	DefaultPersistence    = "full"
)

const description = `keiro's Kafka consumer: reads integration events in a consumer group, records each in the
PostgreSQL inbox and hands it to a handler (--handler=http POSTs it to a service, --handler=sql calls a
PostgreSQL function in the inbox transaction). Every flag can be set with the environment variable
shown next to it; a flag on the command line wins.`

// grammar is the command line: flags shared by every command, then the commands.
type grammar struct {
	Version      kong.VersionFlag `env:"-" help:"Print the version, commit and Go version, and exit."`
	cli.LogFlags `embed:""`
	DB           dbFlags `embed:""`

	Run         runCmd                 `cmd:"" default:"withargs" help:"Consume and process messages (the default command)."`
	Migrate     migrateCmd             `cmd:"" help:"Apply the database migrations and exit."`
	Status      statusCmd              `cmd:"" help:"Print the schema version and the inbox's failed-row counts."`
	Inbox       inboxCmd               `cmd:"" help:"Inspect and re-run inbox rows."`
	Healthcheck sidecar.HealthcheckCmd `cmd:"" help:"GET this consumer's /readyz (or /healthz) and exit 0 when healthy, 1 otherwise (container healthchecks)."`
}

// dbFlags locate the inbox tables: the database flags both binaries share.
type dbFlags struct {
	sidecar.DB
}

// ValidateFlags reports a missing URL and a bad schema name.
func (f *dbFlags) ValidateFlags() error { return f.Validate(EnvPrefix) }

// identityFlags name the inbox consumer: the first part of every inbox row's key.
type identityFlags struct {
	Group string `help:"Kafka consumer group (required for run)." placeholder:"GROUP"`
	Name  string `help:"Inbox consumer name, the first part of each inbox row's key. Defaults to --group." placeholder:"NAME"`
}

// consumerName is the inbox consumer name: --name, else --group.
func (f *identityFlags) consumerName() string {
	if f.Name != "" {
		return f.Name
	}
	return f.Group
}

// handlerFlags choose and configure the handler mode.
type handlerFlags struct {
	Handler     string        `help:"Handler mode (required): http (POST each event to --http-url; at-least-once, with an Idempotency-Key) or sql (call --sql-function in the inbox transaction; exactly-once effects)." placeholder:"MODE"`
	HTTPURL     cli.DSN       `name:"http-url" help:"URL each event is POSTed to in http mode; https:// for TLS." placeholder:"URL"`
	HTTPTimeout time.Duration `name:"http-timeout" help:"Timeout of one HTTP delivery, response included." default:"10s"`
	HTTPFormat  string        `name:"http-format" help:"Request body in http mode: keiro (keiro's JSON document), cloudevents-structured or cloudevents-binary (CloudEvents 1.0 HTTP binding)." default:"keiro" placeholder:"FORMAT"`
	HTTPHeader  []cli.Secret  `name:"http-header" sep:"none" help:"Extra request header in http mode, as 'Name: value' (repeatable; values are secret, e.g. Authorization)." placeholder:"HEADER"`
	SQLFunction string        `name:"sql-function" help:"PostgreSQL function called as SELECT fn($1::jsonb) in sql mode: name or schema.name." placeholder:"FUNCTION"`

	SchemaRegistryURL      cli.DSN    `name:"schema-registry-url" help:"Confluent Schema Registry URL, to hand Avro payloads over as JSON (without it they travel as base64)." placeholder:"URL"`
	SchemaRegistryUser     string     `name:"schema-registry-user" help:"Schema Registry basic-auth user." placeholder:"USER"`
	SchemaRegistryPassword cli.Secret `name:"schema-registry-password" help:"Schema Registry basic-auth password." placeholder:"PASSWORD"`
}

// ValidateFlags reports every problem with the handler configuration.
func (f *handlerFlags) ValidateFlags() error {
	var p cli.Problems
	switch f.Handler {
	case "http":
		if f.HTTPURL == "" {
			p.Add("http-url", "is required with --handler=http")
		} else if _, err := handlers.NewHTTP(handlers.HTTPConfig{URL: f.HTTPURL.Reveal(), Consumer: "x"}); err != nil {
			p.Add("http-url", "must be an absolute http:// or https:// URL, got %s", f.HTTPURL)
		}
		if _, err := handlers.NewHTTP(handlers.HTTPConfig{URL: "http://x", Consumer: "x", Format: f.HTTPFormat}); err != nil {
			p.Add("http-format", "unknown format %q: use keiro, cloudevents-structured or cloudevents-binary", f.HTTPFormat)
		}
		if f.HTTPTimeout <= 0 {
			p.Add("http-timeout", "must be positive, got %s", f.HTTPTimeout)
		}
		if _, err := f.headers(); err != nil {
			p.AddErr("http-header", err)
		}
	case "sql":
		if f.SQLFunction == "" {
			p.Add("sql-function", "is required with --handler=sql")
		} else if _, err := handlers.NewSQL(handlers.SQLConfig{Function: f.SQLFunction}); err != nil {
			p.Add("sql-function", "%q is not a name or schema.name of plain identifiers (letters, digits, _ and $)", f.SQLFunction)
		}
	case "":
		p.Add("handler", "is required: http or sql")
	default:
		p.Add("handler", "unknown mode %q: use http or sql", f.Handler)
	}
	if f.SchemaRegistryPassword != "" && f.SchemaRegistryUser == "" {
		p.Add("schema-registry-user", "is required when --schema-registry-password is set")
	}
	if (f.SchemaRegistryUser != "" || f.SchemaRegistryPassword != "") && f.SchemaRegistryURL == "" {
		p.Add("schema-registry-url", "is required when schema registry credentials are set")
	}
	return p.Err()
}

// headers parses --http-header values. Errors never echo a value.
func (f *handlerFlags) headers() (http.Header, error) {
	h := http.Header{}
	for i, s := range f.HTTPHeader {
		name, value, ok := strings.Cut(s.Reveal(), ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") || strings.ContainsAny(value, "\r\n") {
			return nil, fmt.Errorf("value #%d is not 'Name: value'", i+1)
		}
		h.Add(textproto.CanonicalMIMEHeaderKey(name), strings.TrimSpace(value))
	}
	return h, nil
}

// consumerSidecar describes the consumer to the code it shares with the relay.
var consumerSidecar = &sidecar.Sidecar{
	Name:            "consumer",
	Description:     description,
	EnvPrefix:       EnvPrefix,
	DefaultHTTPAddr: DefaultHTTPAddr,
}

// run parses args and runs the selected command; it returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return consumerSidecar.Run(ctx, &grammar{}, args, stdout, stderr)
}
