package keirotest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

// InboxStatus is the state of an inbox row as the kit's inbox assertions match it: the row's
// status column together with its poisoned and dead-lettered marks. The assertions fail the
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
	// Entry is the stored row, as inbox.Store.Lookup returns it (envelope, attempts, last
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
func resolveInboxSchema(ctx context.Context, q outbox.Querier, schema string) (string, error) {
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
func readInbox(ctx context.Context, q outbox.Querier, schema, consumer, messageID string) ([]inboxLine, error) {
	rows, err := q.Query(ctx, fmt.Sprintf(sqlInboxRows, schema), consumer, messageID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (inboxLine, error) {
		var (
			l                      inboxLine
			status                 string
			poisoned, deadLettered bool
			attempts               int32
		)
		err := r.Scan(&l.source, &l.dedupeKey, &l.messageID, &l.eventType, &status, &attempts, &poisoned,
			&deadLettered, &l.lastError)
		l.attempts = int(attempts)
		switch {
		case status == "completed":
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
func lookupInbox(ctx context.Context, q outbox.Querier, schema, consumer string, l inboxLine) (InboxRow, error) {
	st, err := inbox.NewStore(inbox.StoreConfig{Schema: schema, Consumer: consumer})
	if err != nil {
		return InboxRow{}, err
	}
	e, err := st.Lookup(ctx, q, inbox.Key{Source: l.source, DedupeKey: l.dedupeKey})
	if err != nil {
		return InboxRow{}, err
	}
	return InboxRow{Entry: e, Status: l.status}, nil
}

// inboxConsumers lists the consumers with rows in the inbox of schema, for a failure message
// about a consumer that has none.
func inboxConsumers(ctx context.Context, q outbox.Querier, schema string) []string {
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

var _ = testing.TB(nil)
