package main

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/kafkaconfig"
)

// topicCheckTimeout bounds the startup look-up of the topics' metadata.
const topicCheckTimeout = 10 * time.Second

// dlqTopic is the dead-letter topic of topic under the --dlq-topic template.
func dlqTopic(tmpl, topic string) string { return strings.ReplaceAll(tmpl, "{topic}", topic) }

// preflight refuses (exit 2) a configuration that cannot work, before any record is read:
// a --sql-function that does not exist with the (jsonb) signature, and, with --require-topics,
// consumed or dead-letter topics that do not exist (otherwise they are logged as warnings).
func (c *runCmd) preflight(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	if c.H.Handler == "sql" {
		if err := checkSQLFunction(ctx, pool, c.H.SQLFunction); err != nil {
			return err
		}
	}
	return c.checkTopics(ctx, log)
}

// checkSQLFunction looks fn(jsonb) up as PostgreSQL resolves it (search_path included).
func checkSQLFunction(ctx context.Context, pool *pgxpool.Pool, fn string) error {
	var found *string
	if err := pool.QueryRow(ctx, `SELECT to_regprocedure($1)::text`, fn+"(jsonb)").Scan(&found); err != nil {
		return fmt.Errorf("look up --sql-function %s(jsonb): %w", fn, err)
	}
	if found == nil {
		var others []string
		rows, err := pool.Query(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.proname = $1 ORDER BY 1 LIMIT 5`, fn[strings.LastIndexByte(fn, '.')+1:])
		if err == nil {
			for rows.Next() {
				var s string
				if rows.Scan(&s) == nil {
					others = append(others, s)
				}
			}
			rows.Close()
		}
		hint := ""
		if len(others) > 0 {
			hint = " (found " + strings.Join(others, ", ") + ")"
		}
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf(
			"--sql-function: no function %s(jsonb) in the database%s: create it, e.g. CREATE FUNCTION %s(doc jsonb) RETURNS void …, "+
				"or fix the name (schema.name, or a name on the connection's search_path)", fn, hint, fn)}
	}
	return nil
}

// checkTopics asks the brokers which of the consumed and dead-letter topics exist. Missing
// ones are warnings, or an error (exit 2) with --require-topics. When no broker answers, the
// check is skipped with a warning (the consumer keeps retrying), unless --require-topics.
func (c *runCmd) checkTopics(ctx context.Context, log *slog.Logger) error {
	kopts, err := c.kafkaOpts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(kopts, kafkaconfig.Logger(log))...)
	if err != nil {
		return fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	want := map[string]string{} // topic → what it is for
	for _, t := range c.Topics {
		want[t] = "consumed"
		want[dlqTopic(c.DLQTopic, t)] = "dead-letter topic of " + t
	}
	names := make([]string, 0, len(want))
	for t := range want {
		names = append(names, t)
	}
	sort.Strings(names)
	mctx, cancel := context.WithTimeout(ctx, topicCheckTimeout)
	defer cancel()
	details, err := kadm.NewClient(cl).ListTopics(mctx, names...)
	if err != nil {
		if c.RequireTopics {
			return fmt.Errorf("check that the topics exist (--require-topics): no answer from the brokers %v within %s: %w",
				c.Kafka.Brokers, topicCheckTimeout, err)
		}
		log.Warn("could not check that the topics exist; consuming anyway", "brokers", c.Kafka.Brokers, "err", err)
		return nil
	}
	var missing []string
	for _, t := range names {
		if d, ok := details[t]; !ok || d.Err != nil {
			missing = append(missing, fmt.Sprintf("%s (%s)", t, want[t]))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if c.RequireTopics {
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf(
			"--require-topics: these topics do not exist: %s; create them, or fix --topics/--dlq-topic", strings.Join(missing, ", "))}
	}
	log.Warn("topics do not exist (yet): consuming waits for them, and dead-lettering into a missing topic stalls its partition "+
		"unless the brokers auto-create topics; create them or start with --require-topics to refuse", "topics", missing)
	return nil
}
