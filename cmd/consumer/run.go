package main

import (
	"context"
	"errors"
	"time"

	"github.com/keiro-go/keiro/internal/cli"
)

// runCmd consumes and processes messages until SIGTERM.
type runCmd struct {
	ID identityFlags `embed:""`
	H  handlerFlags  `embed:""`

	Brokers      []string      `help:"Kafka bootstrap brokers, host:port, comma separated (required)." placeholder:"HOST:PORT"`
	Topics       []string      `help:"Topics to consume, comma separated (required)." placeholder:"TOPIC"`
	DLQTopic     string        `name:"dlq-topic" help:"Dead-letter topic for poisoned messages (original bytes and headers plus the reason). Empty: poisoned messages stay only in the inbox as failed rows." placeholder:"TOPIC"`
	MaxAttempts  int           `help:"Handler attempts before a message is poisoned." default:"5"`
	BatchSize    int           `help:"Records processed per inbox transaction at most." default:"100"`
	Concurrency  int           `help:"Partitions processed in parallel." default:"1"`
	DedupePolicy string        `help:"Dedupe key: message-id, source-event (source event id or global position) or kafka-delivery (topic:partition:offset)." default:"message-id"`
	Persistence  string        `help:"What a completed inbox row keeps: full (the envelope) or dedupe-only." default:"full"`
	Retention    time.Duration `help:"How long completed inbox rows are kept, the dedupe window; 0 keeps them forever." default:"720h"`
	HTTPAddr     string        `name:"http-addr" help:"Address of /healthz, /readyz and /metrics; empty disables." default:"127.0.0.1:9465"`
	Migrate      bool          `help:"Apply database migrations before consuming."`
}

// ValidateFlags reports every problem with the run configuration.
func (c *runCmd) ValidateFlags() error {
	var p cli.Problems
	if c.ID.Group == "" {
		p.Add("group", "is required (or set $%s_GROUP)", EnvPrefix)
	}
	if len(c.Brokers) == 0 {
		p.Add("brokers", "is required (or set $%s_BROKERS)", EnvPrefix)
	}
	if len(c.Topics) == 0 {
		p.Add("topics", "is required (or set $%s_TOPICS)", EnvPrefix)
	}
	for _, t := range c.Topics {
		if t == c.DLQTopic && t != "" {
			p.Add("dlq-topic", "%q is also consumed; use a topic the consumer does not read", t)
		}
	}
	if c.MaxAttempts < 1 {
		p.Add("max-attempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	if c.BatchSize < 1 {
		p.Add("batch-size", "must be at least 1, got %d", c.BatchSize)
	}
	if c.Concurrency < 1 {
		p.Add("concurrency", "must be at least 1, got %d", c.Concurrency)
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
	return p.Err()
}

// Run consumes until ctx is cancelled (SIGTERM).
func (c *runCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	return errors.New("run: not wired yet (waiting for the inbox consumer)")
}
