package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/inbox"
)

// inboxCmd groups the operator commands on inbox rows.
type inboxCmd struct {
	Failed failedCmd `cmd:"" help:"Failed (and poisoned) inbox rows."`
}

// failedCmd lists and re-runs failed rows.
type failedCmd struct {
	List  failedListCmd  `cmd:"" help:"List the consumer's failed rows, oldest failure first."`
	Retry failedRetryCmd `cmd:"" help:"Re-run failed rows now, from their stored envelope, through the configured handler."`
}

// failedListCmd lists failed rows.
type failedListCmd struct {
	ID     identityFlags `embed:""`
	Source string        `help:"Only rows of this source." placeholder:"SOURCE"`
	Limit  int           `help:"Rows listed at most." default:"100"`
	JSON   bool          `name:"json" help:"Print JSON lines instead of a table."`
}

// failedRow is one line of `inbox failed list --json`.
type failedRow struct {
	Key        string     `json:"key"` // source:dedupe-key, as retry takes it
	Source     string     `json:"source"`
	DedupeKey  string     `json:"dedupe_key"`
	MessageID  string     `json:"message_id"`
	Attempts   int        `json:"attempts"`
	Poisoned   bool       `json:"poisoned"`
	FailedAt   *time.Time `json:"failed_at"`
	ReceivedAt time.Time  `json:"received_at"`
	Topic      string     `json:"topic,omitempty"`
	Partition  *int32     `json:"partition,omitempty"`
	Offset     *int64     `json:"offset,omitempty"`
	LastError  string     `json:"last_error"`
}

// ValidateFlags requires a consumer name.
func (c *failedListCmd) ValidateFlags() error {
	var p cli.Problems
	if c.ID.consumerName() == "" {
		p.Add("name", "is required (or --group): the inbox consumer whose rows to list")
	}
	if c.Limit < 1 {
		p.Add("limit", "must be at least 1, got %d", c.Limit)
	}
	return p.Err()
}

// Run prints one line per failed row: its key (source:dedupe-key, as retry takes it), attempts,
// whether it is poisoned, when it last failed, where it came from and the last error.
func (c *failedListCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	store, err := inbox.NewStore(inbox.StoreConfig{Schema: g.DB.Schema, Consumer: c.ID.consumerName()})
	if err != nil {
		return err
	}
	admin := inbox.NewAdmin(store)
	pool, err := g.DB.OpenPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	enc := json.NewEncoder(env.Stdout)
	if !c.JSON {
		fmt.Fprintln(tw, "KEY\tATTEMPTS\tPOISONED\tFAILED AT\tKAFKA\tLAST ERROR")
	}
	var after *inbox.Entry
	for n := 0; n < c.Limit; {
		page, err := admin.ListFailed(ctx, pool, inbox.ListOptions{Source: c.Source, Limit: min(c.Limit-n, inbox.DefaultListLimit), After: after})
		if err != nil {
			return err
		}
		for _, e := range page {
			if c.JSON {
				r := failedRow{Key: e.Source + ":" + e.DedupeKey, Source: e.Source, DedupeKey: e.DedupeKey,
					MessageID: e.Delivery.Event.MessageID, Attempts: e.Attempts, Poisoned: e.Poisoned, FailedAt: e.FailedAt,
					ReceivedAt: e.ReceivedAt, LastError: e.LastError}
				if k := e.Delivery.Kafka; k != nil {
					r.Topic, r.Partition, r.Offset = k.Topic, &k.Partition, &k.Offset
				}
				if err := enc.Encode(r); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(tw, "%s:%s\t%d\t%t\t%s\t%s\t%s\n", e.Source, e.DedupeKey, e.Attempts, e.Poisoned,
				formatTime(e.FailedAt), kafkaRef(e.Delivery.Kafka), oneLine(e.LastError, 160))
		}
		n += len(page)
		if len(page) == 0 || len(page) < inbox.DefaultListLimit {
			break
		}
		after = &page[len(page)-1]
	}
	return tw.Flush()
}

// failedRetryCmd re-runs failed rows. Its selection and confirmation flags have no
// environment variable (env:"-"): a variable left in a shell or a pod spec must never select
// or confirm a re-run.
type failedRetryCmd struct {
	ID          identityFlags `embed:""`
	H           handlerFlags  `embed:""`
	MaxAttempts int           `help:"Attempt ceiling recorded when a re-run fails again." default:"5"`
	All         bool          `env:"-" help:"Re-run every failed row of the consumer (needs --yes). Command line only."`
	Yes         bool          `env:"-" help:"Confirm --all. Command line only."`
	DryRun      bool          `env:"-" name:"dry-run" help:"Print the rows that would be re-run and change nothing."`
	Keys        []string      `arg:"" optional:"" help:"Rows to re-run, as source:dedupe-key (as printed by list)." placeholder:"SOURCE:KEY"`
}

// ValidateFlags requires a consumer name and either keys or --all.
func (c *failedRetryCmd) ValidateFlags() error {
	var p cli.Problems
	if c.ID.consumerName() == "" {
		p.Add("name", "is required (or --group): the inbox consumer whose rows to re-run")
	}
	if c.All == (len(c.Keys) > 0) {
		p.Add("all", "give either row keys (source:dedupe-key) or --all --yes")
	}
	if c.All && !c.Yes && !c.DryRun {
		p.Add("yes", "--all re-runs every failed row of the consumer; add --yes to confirm (or --dry-run to see them)")
	}
	for _, k := range c.Keys {
		if _, err := parseKey(k); err != nil {
			p.AddErr("keys", err)
		}
	}
	if c.MaxAttempts < 1 {
		p.Add("max-attempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	return p.Err()
}

// Run re-runs each row through the handler in an inbox transaction (inbox.Admin.Reprocess) and
// prints its outcome. It fails when a row is missing or its re-run failed again.
func (c *failedRetryCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	log, err := g.Logger(env.Stderr)
	if err != nil {
		return err
	}
	store, err := inbox.NewStore(inbox.StoreConfig{Schema: g.DB.Schema, Consumer: c.ID.consumerName(), MaxAttempts: c.MaxAttempts})
	if err != nil {
		return err
	}
	admin := inbox.NewAdmin(store)
	h, err := buildHandler(&c.H, c.ID.consumerName(), inbox.DedupeMessageID, log)
	if err != nil {
		return err
	}
	defer h.close()
	pool, err := g.DB.OpenPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	keys := make([]inbox.Key, 0, len(c.Keys))
	for _, s := range c.Keys {
		k, _ := parseKey(s) // validated
		keys = append(keys, k)
	}
	if c.All {
		var after *inbox.Entry
		for {
			page, err := admin.ListFailed(ctx, pool, inbox.ListOptions{After: after})
			if err != nil {
				return err
			}
			for _, e := range page {
				keys = append(keys, inbox.Key{Source: e.Source, DedupeKey: e.DedupeKey})
			}
			if len(page) < inbox.DefaultListLimit {
				break
			}
			after = &page[len(page)-1]
		}
	}
	if c.DryRun {
		return dryRunRetry(ctx, env, admin, pool, keys)
	}
	var failed int
	for _, k := range keys {
		res, err := admin.Reprocess(ctx, pool, k, h.handle)
		name := k.Source + ":" + k.DedupeKey
		switch {
		case err != nil:
			failed++
			fmt.Fprintf(env.Stdout, "%s\terror\t%s\n", name, oneLine(err.Error(), 300))
		case res.Outcome == inbox.Processed || res.Outcome == inbox.Duplicate:
			fmt.Fprintf(env.Stdout, "%s\t%s\n", name, res.Outcome)
		default:
			failed++
			fmt.Fprintf(env.Stdout, "%s\t%s\tattempts=%d\t%s\n", name, res.Outcome, res.Attempts, oneLine(fmt.Sprint(res.Err), 300))
		}
	}
	fmt.Fprintf(env.Stdout, "%d of %d rows re-run successfully\n", len(keys)-failed, len(keys))
	if failed > 0 {
		return &cli.ExitError{Code: cli.ExitFailure, Err: fmt.Errorf("%d of %d rows failed again; see `consumer inbox failed list`", failed, len(keys))}
	}
	return nil
}

// dryRunRetry prints what a retry of keys would re-run: each failed row with its attempts and
// last error, and the keys that would be skipped (missing or not failed).
func dryRunRetry(ctx context.Context, env *cli.Env, admin *inbox.Admin, db keiro.DB, keys []inbox.Key) error {
	n := 0
	for _, k := range keys {
		name := k.Source + ":" + k.DedupeKey
		e, err := admin.Lookup(ctx, db, k)
		switch {
		case errors.Is(err, inbox.ErrNotFound):
			fmt.Fprintf(env.Stdout, "%s\tskip\tno such row\n", name)
		case err != nil:
			return err
		case e.Status != inbox.StatusFailed:
			fmt.Fprintf(env.Stdout, "%s\tskip\t%s\n", name, e.Status)
		default:
			n++
			fmt.Fprintf(env.Stdout, "%s\twould re-run\tattempts=%d\t%s\n", name, e.Attempts, oneLine(e.LastError, 300))
		}
	}
	fmt.Fprintf(env.Stdout, "would re-run %d of %d rows (--dry-run: nothing changed)\n", n, len(keys))
	return nil
}

// parseKey splits "source:dedupe-key" at the first colon (dedupe keys may contain colons,
// sources may not).
func parseKey(s string) (inbox.Key, error) {
	src, key, ok := strings.Cut(s, ":")
	if !ok || src == "" || key == "" {
		return inbox.Key{}, errors.New(strconv.Quote(s) + " is not source:dedupe-key")
	}
	return inbox.Key{Source: src, DedupeKey: key}, nil
}

func kafkaRef(k *inbox.KafkaRef) string {
	if k == nil {
		return "-"
	}
	return fmt.Sprintf("%s/%d@%d", k.Topic, k.Partition, k.Offset)
}

func formatTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// oneLine flattens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
