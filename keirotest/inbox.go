package keirotest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

// InboxStatus is the state of an inbox row as the kit's inbox assertions match it: the row's
// status column (an inbox.Status) together with its poisoned and dead-lettered marks, which
// split inbox.StatusFailed in three. The assertions fail the
// test on any value but these constants.
type InboxStatus string

// The states of an inbox row (the inbox's state machine: docs/architecture.md). They are
// exclusive: a dead-lettered row is not also InboxPoisoned.
const (
	// InboxCompleted: the handler's effects committed with the row (inbox.Processed); a
	// redelivery is a duplicate.
	InboxCompleted InboxStatus = "completed"
	// InboxRetrying: the handler failed below the attempt ceiling (inbox.HandlerFailed); a
	// redelivery runs it again.
	InboxRetrying InboxStatus = "retrying"
	// InboxPoisoned: the handler failed MaxAttempts times or with inbox.Permanent
	// (inbox.Poisoned), and the message is not (yet) in a dead-letter topic: Deliver leaves
	// rows so, and so does a consumer stopped before its dead-letter produce was acknowledged.
	InboxPoisoned InboxStatus = "poisoned"
	// InboxDeadLettered: poisoned, and the consumer's dead-letter produce was acknowledged; a
	// redelivery is a duplicate.
	InboxDeadLettered InboxStatus = "dead_lettered"
)

// InboxStatuses are every InboxStatus, in the order of the inbox's state machine.
var InboxStatuses = []InboxStatus{InboxCompleted, InboxRetrying, InboxPoisoned, InboxDeadLettered}

// check reports an InboxStatus that is not one of [InboxStatuses]; the empty one (any) is
// valid.
func (s InboxStatus) check() error {
	if s == "" || slices.Contains(InboxStatuses, s) {
		return nil
	}
	return fmt.Errorf("unknown InboxOptions.Status %q: use InboxCompleted, InboxRetrying, InboxPoisoned or "+
		"InboxDeadLettered", string(s))
}

// failed reports whether s is one of the failed states.
func (s InboxStatus) failed() bool { return s != InboxCompleted }

// InboxRow is an inbox row as the kit reads it.
type InboxRow struct {
	// Entry is the stored row, as inbox.Admin.Lookup returns it (envelope, attempts, last
	// error).
	Entry inbox.Entry
	// Status is the row's state.
	Status InboxStatus
}

// inboxLine is the part of an inbox row a failure message shows.
type inboxLine struct {
	source, dedupeKey, messageID, eventType, lastError string
	status                                             InboxStatus
	attempts                                           int
}

func (l inboxLine) String() string {
	s := fmt.Sprintf("[%s] message id %q (%s, source %q, dedupe key %q)", l.status, l.messageID, l.eventType,
		l.source, l.dedupeKey)
	if l.attempts > 0 || l.lastError != "" {
		s += fmt.Sprintf(" — %s, last error: %s", plural(l.attempts, "failed attempt"), clip(l.lastError, 200))
	}
	return s
}

// resolveInboxSchema is resolveSchema for the inbox: schema if set (after checking it holds an
// inbox), else the schema of the keiro_outbox table on q's search_path, else "keiro".
func resolveInboxSchema(ctx context.Context, q keiro.DB, schema string) (string, error) {
	if schema == "" {
		found, err := outbox.ResolveSchema(ctx, q)
		if errors.Is(err, outbox.ErrNoOutbox) {
			return "", fmt.Errorf("no keiro schema on the search_path and none named keiro: migrate one "+
				"(keirotest.NewDB does) or name the schema of your inbox in the Schema option (%w)", err)
		}
		if err != nil {
			return "", err
		}
		schema = found
	} else if err := migrations.ValidateSchema(schema); err != nil {
		return "", fmt.Errorf("schema %q: %w", schema, err)
	}
	var exists bool
	if err := q.QueryRow(ctx, sqlTableExists, schema+".keiro_inbox").Scan(&exists); err != nil {
		return "", fmt.Errorf("find the inbox table: %w", err)
	}
	if !exists {
		return "", fmt.Errorf("there is no table %s.keiro_inbox: migrate the schema (keirotest.NewDB and "+
			"NewSchema do), or name the schema of your inbox in the Schema option", schema)
	}
	return schema, nil
}

// readInbox lists consumer's rows of the inbox in schema (only those of messageID unless it
// is empty).
func readInbox(ctx context.Context, q keiro.DB, schema, consumer, messageID string) ([]inboxLine, error) {
	rows, err := q.Query(ctx, fmt.Sprintf(sqlInboxRows, schema), consumer, messageID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (inboxLine, error) {
		var (
			l                      inboxLine
			status                 inbox.Status
			poisoned, deadLettered bool
			attempts               int32
		)
		err := r.Scan(&l.source, &l.dedupeKey, &l.messageID, &l.eventType, &status, &attempts, &poisoned,
			&deadLettered, &l.lastError)
		l.attempts = int(attempts)
		switch {
		case status == inbox.StatusCompleted:
			l.status = InboxCompleted
		case deadLettered:
			l.status = InboxDeadLettered
		case poisoned:
			l.status = InboxPoisoned
		default:
			l.status = InboxRetrying
		}
		return l, err
	})
}

// lookupInbox reads the whole row of l through the inbox package itself.
func lookupInbox(ctx context.Context, q keiro.DB, schema, consumer string, l inboxLine) (InboxRow, error) {
	st, err := inbox.NewStore(inbox.StoreConfig{Schema: schema, Consumer: consumer})
	if err != nil {
		return InboxRow{}, err
	}
	e, err := inbox.NewAdmin(st).Lookup(ctx, q, inbox.Key{Source: l.source, DedupeKey: l.dedupeKey})
	if err != nil {
		return InboxRow{}, err
	}
	return InboxRow{Entry: e, Status: l.status}, nil
}

// inboxConsumers lists the consumers with rows in the inbox of schema, for a failure message
// about a consumer that has none.
func inboxConsumers(ctx context.Context, q keiro.DB, schema string) []string {
	rows, err := q.Query(ctx, fmt.Sprintf(sqlInboxConsumers, schema))
	if err != nil {
		return nil
	}
	names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	return names
}

// inboxCtx is the context of one inbox read.
func inboxCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// InboxOptions narrows RequireProcessed and RequireInboxFailed. Empty fields match anything.
type InboxOptions struct {
	// Schema is the schema of the inbox. Defaults to the schema of the keiro_outbox table on
	// q's search_path (a NewDB pool's schema, a NewTx transaction's), else "keiro".
	Schema string
	// Consumer is the inbox consumer name. Defaults to DefaultConsumer, the name Deliver and
	// RunConsumer use; a Consumer's own Require methods default to its name.
	Consumer string
	// Source is the producing bounded context, for a message id two sources share. Defaults
	// to any.
	Source string
	// Status is the row's state, one of [InboxStatuses]; any other value fails the test.
	// RequireProcessed accepts only InboxCompleted; RequireInboxFailed accepts the failed
	// states (InboxRetrying, InboxPoisoned, InboxDeadLettered). Defaults to any of those.
	Status InboxStatus
	// Attempts is the row's failed-attempt count. Defaults to 0: any.
	Attempts int
	// Error is text the row's last error must contain. Defaults to any.
	Error string
}

// RequireProcessed fails t unless the inbox holds message messageID as completed for the
// consumer (InboxOptions.Consumer, else DefaultConsumer): its handler's effects committed. It
// returns the row. q is a pool, or the transaction the delivery ran in (NewTx). The failure
// message shows the message's row when it is not completed, else the consumer's rows. At most
// one InboxOptions may be given.
func RequireProcessed(t testing.TB, q keiro.DB, messageID string, opts ...InboxOptions) InboxRow {
	t.Helper()
	const who = "keirotest.RequireProcessed"
	o := inboxOptions(t, who, opts)
	if o.Status != "" && o.Status != InboxCompleted {
		t.Fatalf("%s: InboxOptions.Status %s is a failed state: use RequireInboxFailed for it", who, o.Status)
	}
	o.Status = InboxCompleted
	return requireInbox(t, who, q, messageID, o)
}

// RequireInboxFailed fails t unless the inbox holds message messageID as failed for the
// consumer (InboxOptions.Consumer, else DefaultConsumer): retrying, poisoned or dead-lettered,
// or the one of those InboxOptions.Status names. It returns the row, with its attempts and last
// error. q is a pool or the delivery's transaction, as for RequireProcessed. At most one
// InboxOptions may be given.
func RequireInboxFailed(t testing.TB, q keiro.DB, messageID string, opts ...InboxOptions) InboxRow {
	t.Helper()
	const who = "keirotest.RequireInboxFailed"
	o := inboxOptions(t, who, opts)
	if o.Status == InboxCompleted {
		t.Fatalf("%s: InboxOptions.Status %s is not a failed state: use RequireProcessed for it", who, o.Status)
	}
	return requireInbox(t, who, q, messageID, o)
}

// RequireProcessed is keirotest.RequireProcessed on the consumer's inbox: InboxOptions.Schema
// and Consumer default to the consumer's.
func (c *Consumer) RequireProcessed(t testing.TB, messageID string, opts ...InboxOptions) InboxRow {
	t.Helper()
	return RequireProcessed(t, c.pool, messageID, c.inboxOptions(opts)...)
}

// RequireInboxFailed is keirotest.RequireInboxFailed on the consumer's inbox:
// InboxOptions.Schema and Consumer default to the consumer's.
func (c *Consumer) RequireInboxFailed(t testing.TB, messageID string, opts ...InboxOptions) InboxRow {
	t.Helper()
	return RequireInboxFailed(t, c.pool, messageID, c.inboxOptions(opts)...)
}

// inboxOptions returns opts with the consumer's schema and name as defaults.
func (c *Consumer) inboxOptions(opts []InboxOptions) []InboxOptions {
	if len(opts) > 1 {
		return opts // refused by inboxOptions
	}
	var o InboxOptions
	if len(opts) == 1 {
		o = opts[0]
	}
	if o.Schema == "" {
		o.Schema = c.Schema
	}
	if o.Consumer == "" {
		o.Consumer = c.Name
	}
	return []InboxOptions{o}
}

// inboxOptions checks opts and returns the one given, with its defaults.
func inboxOptions(t testing.TB, who string, opts []InboxOptions) InboxOptions {
	t.Helper()
	if len(opts) > 1 {
		t.Fatalf("%s: at most one InboxOptions may be given, got %d", who, len(opts))
	}
	var o InboxOptions
	if len(opts) == 1 {
		o = opts[0]
	}
	if err := o.Status.check(); err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	if o.Attempts < 0 {
		t.Fatalf("%s: InboxOptions.Attempts must not be negative, got %d", who, o.Attempts)
	}
	if o.Consumer == "" {
		o.Consumer = DefaultConsumer
	}
	return o
}

// requireInbox is RequireProcessed and RequireInboxFailed: o.Status empty means any failed
// state.
func requireInbox(t testing.TB, who string, q keiro.DB, messageID string, o InboxOptions) InboxRow {
	t.Helper()
	if q == nil {
		t.Fatalf("%s: the querier is nil; pass a pool or the delivery's transaction", who)
	}
	if messageID == "" {
		t.Fatalf("%s: the message id is empty", who)
	}
	ctx, cancel := inboxCtx()
	defer cancel()
	schema, err := resolveInboxSchema(ctx, q, o.Schema)
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	all, err := readInbox(ctx, q, schema, o.Consumer, "")
	if err != nil {
		t.Fatalf("%s: read the inbox of schema %q: %v", who, schema, err)
	}
	var mine []inboxLine
	for _, l := range all {
		if l.messageID == messageID && (o.Source == "" || l.source == o.Source) {
			mine = append(mine, l)
		}
	}
	want := fmt.Sprintf("message id %q", messageID)
	if o.Source != "" {
		want += fmt.Sprintf(", source %q", o.Source)
	}
	switch {
	case o.Status != "":
		want += ", " + string(o.Status)
	default:
		want += ", failed (retrying, poisoned or dead_lettered)"
	}
	if o.Attempts != 0 {
		want += ", " + plural(o.Attempts, "failed attempt")
	}
	if o.Error != "" {
		want += fmt.Sprintf(", last error containing %q", o.Error)
	}
	where := fmt.Sprintf("the inbox of consumer %q in schema %q", o.Consumer, schema)
	switch {
	case len(mine) == 0 && len(all) == 0:
		found := fmt.Sprintf("  found: %s is empty", where)
		if others := inboxConsumers(ctx, q, schema); len(others) > 0 {
			found += fmt.Sprintf("; the inbox holds rows of consumers %q: name yours in InboxOptions.Consumer", others)
		} else {
			found += " (was the message delivered? did the delivery's transaction roll back?)"
		}
		t.Fatalf("%s: no inbox row of message %q\n  want: %s\n%s", who, messageID, want, found)
	case len(mine) == 0:
		t.Fatalf("%s: no inbox row of message %q\n  want: %s\n  found %s in %s:%s", who, messageID, want,
			plural(len(all), "row"), where, listing(len(all), func(i int) string { return all[i].String() }, nil))
	case len(mine) > 1:
		t.Fatalf("%s: message %q has %s, one per source: name the source in InboxOptions.Source\n  found:%s", who,
			messageID, plural(len(mine), "inbox row"), listing(len(mine), func(i int) string { return mine[i].String() }, nil))
	}
	l := mine[0]
	var diffs []string
	switch {
	case o.Status == "" && !l.status.failed():
		diffs = append(diffs, fmt.Sprintf("it is %s, want a failed state", l.status))
	case o.Status != "" && l.status != o.Status:
		diffs = append(diffs, fmt.Sprintf("it is %s, want %s", l.status, o.Status))
	}
	if o.Attempts != 0 && l.attempts != o.Attempts {
		diffs = append(diffs, fmt.Sprintf("it has %s, want %d", plural(l.attempts, "failed attempt"), o.Attempts))
	}
	if o.Error != "" && !strings.Contains(l.lastError, o.Error) {
		diffs = append(diffs, fmt.Sprintf("its last error is %q, want one containing %q", clip(l.lastError, 200), o.Error))
	}
	if len(diffs) > 0 {
		t.Fatalf("%s: the inbox row of message %q does not match\n  want: %s\n  found in %s: %s\n  differs: %s", who,
			messageID, want, where, l, strings.Join(diffs, "; "))
	}
	row, err := lookupInbox(ctx, q, schema, o.Consumer, l)
	if err != nil {
		t.Fatalf("%s: read the inbox row of message %q: %v", who, messageID, err)
	}
	return row
}
