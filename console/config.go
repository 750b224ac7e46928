package console

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

// Defaults of [Config].
const (
	// DefaultPageSize is the rows per page when a request does not say.
	DefaultPageSize = 50
	// MaxPageSize is the most rows a page holds, whatever a request asks.
	MaxPageSize = 200
	// DefaultPreviewBytes is the payload preview's size in lists.
	DefaultPreviewBytes = 512
	// DefaultDetailPayloadBytes is the most payload bytes a detail page or answer carries.
	DefaultDetailPayloadBytes = 256 << 10
	// MaxRequestBytes bounds the body of a POST.
	MaxRequestBytes = 1 << 20
	// MaxSelection is the most rows one requeue or retry may name.
	MaxSelection = 1000
	// DeadLetterPageBytes bounds the bytes of records one page of the dead-letter list reads
	// from Kafka, besides the newest record of each partition (which the newest-first merge
	// needs): a page of large records is shorter, and its cursor continues it.
	DeadLetterPageBytes = 16 << 20
	// dlqFetchBytes bounds one Fetch answer of the dead-letter list.
	dlqFetchBytes = 1 << 20
	// DefaultTitle names the console in its pages.
	DefaultTitle = "keiro"
)

// Config configures the console. At least one of Outbox, Inbox and Events must be set.
type Config struct {
	// Outbox enables the outbox pages and /api/v1/outbox/…. Defaults to nil (not served).
	Outbox *OutboxConfig
	// Inbox enables the inbox pages, /api/v1/inbox/… and /api/v1/consumer/lag. Defaults to nil
	// (not served).
	Inbox *InboxConfig
	// Events enables the subscriptions page and /api/v1/subscriptions. Defaults to nil (not
	// served).
	Events *EventsConfig
	// Auth says who may use the console. Defaults to the zero AuthConfig: every request is
	// refused until a token is set or unauthenticated access is allowed.
	Auth AuthConfig
	// ReadOnly refuses every state-changing request and hides the actions. Defaults to false.
	ReadOnly bool
	// Title names the deployment in the pages' header. Defaults to [DefaultTitle].
	Title string
	// Logger receives one record per state-changing request (who, what, outcome) and per
	// refused request. Defaults to slog.Default().
	Logger *slog.Logger
}

// OutboxConfig locates the outbox table.
type OutboxConfig struct {
	// Pool connects to the outbox's database. Required.
	Pool *pgxpool.Pool
	// Schema holds keiro's tables. Defaults to migrations.DefaultSchema.
	Schema string
	// MaxAttempts is the relays' attempt ceiling (RelayConfig.MaxAttempts), shown beside each
	// row's attempts ("3 of 10"). Defaults to 0: unknown, the pages show "3 attempts".
	MaxAttempts int
	// ExactlyOnce, when the console runs in a relay's process, reads that relay's
	// exactly-once state (outbox.Relay.ExactlyOnce): its transactional ids and transactions,
	// shown on the overview. Defaults to nil: not shown.
	ExactlyOnce func() (outbox.ExactlyOnceStatus, bool)
}

// InboxConfig locates one inbox consumer and the Kafka group it reads in.
type InboxConfig struct {
	// Pool connects to the inbox's database. Required.
	Pool *pgxpool.Pool
	// Schema holds keiro's tables. Defaults to migrations.DefaultSchema.
	Schema string
	// Consumer is the inbox consumer name whose failures are listed and retried. Required.
	Consumer string
	// Handler re-runs a failed row on retry (the consumer's own handler). Defaults to nil:
	// retry is not offered.
	Handler inbox.Handler
	// MaxAttempts is the attempt ceiling recorded when a retried row fails again. Defaults to
	// inbox.DefaultMaxAttempts.
	MaxAttempts int
	// Kafka is a client of the group's cluster, used to read the group's committed offsets and
	// the partitions' end offsets (it joins no group). Defaults to nil: lag is not shown.
	Kafka *kgo.Client
	// Group is the Kafka consumer group whose lag is shown. Defaults to Consumer.
	Group string
	// Progress is the running consumer (an *inbox.Consumer in the same process), whose view of
	// the partitions it owns is shown beside the lag: the record in flight, the age of the
	// oldest waiting record, the last commit and the partitions stuck. Defaults to nil: only
	// Kafka's offsets are shown.
	Progress ProgressSource
	// StuckAfter is how long a partition with records waiting may go without moving before it
	// is shown stuck. Defaults to inbox.DefaultStuckAfter.
	StuckAfter time.Duration
	// DeadLetterTopics are the consumer's dead-letter topics (ConsumerConfig.DeadLetterTopic
	// for each topic it reads), listed on the dead-letter page, whose records can be replayed
	// to their source topic through Kafka. Defaults to none: the page is not offered.
	DeadLetterTopics []string
	// Topics are the topics the consumer reads (ConsumerConfig.Topics): a replay writes a
	// dead letter back to its keiro-dlq-topic only when it is one of them, and refuses any
	// other (the header is part of the record, which anyone who may write the dead-letter
	// topic can set). Required with DeadLetterTopics.
	Topics []string
	// TopicsRegex reports that Topics are regular expressions (ConsumerConfig.TopicsRegex): a
	// replay target must match one of them, as the consumer's subscription does. Defaults to
	// false.
	TopicsRegex bool
}

// ProgressSource reports a running consumer's partitions; *inbox.Consumer implements it.
type ProgressSource interface {
	// Progress returns the progress of each partition the consumer owns.
	Progress() []inbox.PartitionProgress
}

// EventsConfig locates the event store whose subscriptions are shown.
type EventsConfig struct {
	// Pool connects to the event store's database. Required.
	Pool *pgxpool.Pool
	// Schema holds keiro's tables. Defaults to migrations.DefaultSchema.
	Schema string
}

// AuthConfig says who may use the console.
type AuthConfig struct {
	// Token is the bearer token, also accepted as the password of basic auth (any user name,
	// which is logged as who acted). When set it is required on every request, loopback
	// included. Defaults to "" (no token).
	Token string
	// AllowUnauthenticated serves requests without credentials when Token is empty: set it
	// only when the server is bound to loopback ([IsLoopback]). Such a console serves only
	// requests whose Host header names loopback (localhost, *.localhost, 127.0.0.0/8, [::1],
	// with or without a port) and answers 421 Misdirected Request to any other Host, so that
	// a web page cannot reach it under its own name (DNS rebinding). Defaults to false:
	// without a token every request is refused with 403.
	AllowUnauthenticated bool
}

func (c *Config) applyDefaults() {
	if c.Title == "" {
		c.Title = DefaultTitle
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Outbox != nil && c.Outbox.Schema == "" {
		c.Outbox.Schema = migrations.DefaultSchema
	}
	if c.Inbox != nil {
		if c.Inbox.Schema == "" {
			c.Inbox.Schema = migrations.DefaultSchema
		}
		if c.Inbox.MaxAttempts == 0 {
			c.Inbox.MaxAttempts = inbox.DefaultMaxAttempts
		}
		if c.Inbox.Group == "" {
			c.Inbox.Group = c.Inbox.Consumer
		}
		if c.Inbox.StuckAfter == 0 {
			c.Inbox.StuckAfter = inbox.DefaultStuckAfter
		}
	}
	if c.Events != nil && c.Events.Schema == "" {
		c.Events.Schema = migrations.DefaultSchema
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.Outbox == nil && c.Inbox == nil && c.Events == nil {
		errs = append(errs, errors.New("set at least one of Outbox, Inbox and Events"))
	}
	if o := c.Outbox; o != nil {
		if o.Pool == nil {
			errs = append(errs, errors.New("Outbox.Pool is required"))
		}
		if err := migrations.ValidateSchema(o.Schema); err != nil {
			errs = append(errs, fmt.Errorf("Outbox.Schema: %w", err))
		}
		if o.MaxAttempts < 0 {
			errs = append(errs, fmt.Errorf("Outbox.MaxAttempts must be 0 (unknown) or more, got %d", o.MaxAttempts))
		}
	}
	if i := c.Inbox; i != nil {
		if i.Pool == nil {
			errs = append(errs, errors.New("Inbox.Pool is required"))
		}
		if i.Consumer == "" {
			errs = append(errs, errors.New("Inbox.Consumer is required: the inbox consumer name"))
		}
		if i.MaxAttempts < 1 {
			errs = append(errs, fmt.Errorf("Inbox.MaxAttempts must be at least 1, got %d", i.MaxAttempts))
		}
		if err := migrations.ValidateSchema(i.Schema); err != nil {
			errs = append(errs, fmt.Errorf("Inbox.Schema: %w", err))
		}
		if i.StuckAfter < 0 {
			errs = append(errs, fmt.Errorf("Inbox.StuckAfter must be positive, got %s", i.StuckAfter))
		}
		for _, t := range i.DeadLetterTopics {
			if err := envelope.ValidateTopic(t); err != nil {
				errs = append(errs, fmt.Errorf("Inbox.DeadLetterTopics: topic %q %v", t, err))
			}
		}
		if len(i.DeadLetterTopics) > 0 && i.Kafka == nil {
			errs = append(errs, errors.New("Inbox.DeadLetterTopics needs Inbox.Kafka: the dead letters are read from Kafka"))
		}
		if len(i.DeadLetterTopics) > 0 && len(i.Topics) == 0 {
			errs = append(errs, errors.New("Inbox.DeadLetterTopics needs Inbox.Topics (the topics the consumer reads): a replay writes only to them"))
		}
		if i.TopicsRegex {
			for _, t := range i.Topics {
				if _, err := regexp.Compile(t); err != nil {
					errs = append(errs, fmt.Errorf("Inbox.Topics: %q is not a regular expression: %v", t, err))
				}
			}
		}
	}
	if e := c.Events; e != nil {
		if e.Pool == nil {
			errs = append(errs, errors.New("Events.Pool is required"))
		}
		if err := migrations.ValidateSchema(e.Schema); err != nil {
			errs = append(errs, fmt.Errorf("Events.Schema: %w", err))
		}
	}
	if strings.ContainsAny(c.Auth.Token, " \t\r\n") {
		errs = append(errs, errors.New("Auth.Token must not contain white space (a token file's trailing newline is trimmed by the sidecars)"))
	}
	return errors.Join(errs...)
}

// IsLoopback reports whether a listen address (host:port) binds loopback only: 127.0.0.0/8,
// ::1 or "localhost". An empty host (all interfaces) is not loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
