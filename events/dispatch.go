package events

import (
	"context"
	"crypto/sha1" //nolint:gosec // UUIDv5 is defined over SHA-1 (RFC 9562 §5.5); it is an identity, not a MAC.
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
)

// Command is a command addressed to one target stream, as a [Router] resolves it or a
// [ProcessManager] emits it.
type Command[C any] struct {
	// Stream is the target stream ("invoice-42").
	Stream string
	// Command is the command run on Stream.
	Command C
}

// Target runs commands on target streams. A *[Runner] is a Target; routers and process
// managers run each command through it with the command's deterministic id as the id of its
// first event (RunOptions.EventIDs), in its own transaction on the keiro.DB they were given (a
// savepoint when that keiro.DB is a transaction).
type Target[C any] interface {
	Run(ctx context.Context, db keiro.DB, stream string, cmd C, opts ...RunOptions) (Result, error)
}

// CommandOutcome is what became of one dispatched command.
type CommandOutcome uint8

const (
	// CommandAppended means the command ran and its events committed (or it was a no-op).
	CommandAppended CommandOutcome = iota + 1
	// CommandDuplicate means the command's id was already in its target stream: an earlier
	// delivery of the same input dispatched it, so it did not run again.
	CommandDuplicate
	// CommandFailed means the command failed; CommandResult.Err says why. Nothing of it
	// committed.
	CommandFailed
)

// String returns "appended", "duplicate" or "failed".
func (o CommandOutcome) String() string {
	switch o {
	case CommandAppended:
		return "appended"
	case CommandDuplicate:
		return "duplicate"
	case CommandFailed:
		return "failed"
	}
	return "CommandOutcome(" + strconv.Itoa(int(o)) + ")"
}

// CommandResult reports one dispatched command.
type CommandResult struct {
	// Stream is the target stream.
	Stream string
	// CommandID is the command's deterministic id (the id of its first event).
	CommandID envelope.UUID
	// Outcome is what became of the command.
	Outcome CommandOutcome
	// Result is the command runner's result when Outcome is CommandAppended.
	Result Result
	// Err is the failure when Outcome is CommandFailed.
	Err error
}

// uuidNamespaceURL is RFC 9562's URL namespace, the namespace of keiro's deterministic ids.
var uuidNamespaceURL = envelope.UUID{0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad, 0x11, 0xd1,
	0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8}

// uuidV5 returns the name-based (SHA-1) UUID of name in namespace (RFC 9562 §5.5).
func uuidV5(namespace envelope.UUID, name []byte) envelope.UUID {
	h := sha1.New() //nolint:gosec // see the import
	h.Write(namespace[:])
	h.Write(name)
	var u envelope.UUID
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	return u
}

// RouterCommandID is keiro's deterministic id of a routed command: the UUIDv5 (URL namespace)
// of the length-prefixed fields "keiro", "router", router, key, the source event id (lowercase,
// hyphenated), the target stream and occurrence (decimal), each written as
// "<byte length>:<bytes>" with nothing between them. occurrence is the command's index among
// the commands of the same resolve that address the same target stream (0 for the first).
// Length prefixes make fields that contain ':' or non-ASCII text unambiguous. The bytes match
// keiro's, so both see the same ids over one database.
func RouterCommandID(router, key string, source envelope.UUID, target string, occurrence int) envelope.UUID {
	return uuidV5(uuidNamespaceURL, lengthPrefixed("keiro", "router", router, key, source.String(), target, strconv.Itoa(occurrence)))
}

// ProcessManagerCommandID is keiro's deterministic id of a process manager's write: the UUIDv5
// (URL namespace) of "keiro:process-manager:<manager>:<correlation>:<source event id>:<index>".
// Index -1 is the manager's own event; target commands use their position 0…n-1 in the
// reaction, which is sound because the reaction is a pure function of the state and input.
func ProcessManagerCommandID(manager, correlation string, source envelope.UUID, index int) envelope.UUID {
	name := "keiro:process-manager:" + manager + ":" + correlation + ":" + source.String() + ":" + strconv.Itoa(index)
	return uuidV5(uuidNamespaceURL, []byte(name))
}

// EventIn reports whether the event with id is stored in stream. Routers and process managers
// use it to recognise a command an earlier delivery already dispatched.
func (s *Store) EventIn(ctx context.Context, q keiro.DB, stream string, id envelope.UUID) (bool, error) {
	var in bool
	if err := q.QueryRow(ctx, s.q.eventIn, id, stream).Scan(&in); err != nil {
		return false, fmt.Errorf("look up event %s in %s: %w", id, stream, err)
	}
	return in, nil
}

// The savepoint that holds each dispatched command when the dispatch runs in a transaction.
const (
	sqlDispatchSavepoint = `SAVEPOINT keiro_dispatch`
	sqlDispatchRollback  = `ROLLBACK TO SAVEPOINT keiro_dispatch`
)

// dispatchCommand runs one command on target with id as its first event's id, unless id is
// already in the stream. On a transaction the command runs after a savepoint, so a failure (a
// concurrent delivery's id that made the insert fail, among others) leaves the transaction
// usable for the next command. A failure that turns out to be id already stored in that stream
// (a concurrent delivery won the race) is a duplicate too; an id stored in another stream is
// not.
func dispatchCommand[C any](ctx context.Context, s *Store, db keiro.DB, target Target[C], cmd Command[C], id envelope.UUID, md Metadata) CommandResult {
	res := CommandResult{Stream: cmd.Stream, CommandID: id}
	if err := ValidateStreamName(cmd.Stream); err != nil {
		res.Outcome, res.Err = CommandFailed, fmt.Errorf("dispatch command: %w", err)
		return res
	}
	// On a transaction, the pre-check travels with a savepoint in one round trip; a failed
	// command rolls back to it. The savepoint of a command that succeeded is not released:
	// the next command's nests in it, and ROLLBACK TO names the newest.
	tx, isTx := db.(pgx.Tx)
	var in bool
	var err error
	if isTx {
		b := &pgx.Batch{}
		b.Queue(s.q.eventIn, id, cmd.Stream).QueryRow(func(row pgx.Row) error { return row.Scan(&in) })
		b.Queue(sqlDispatchSavepoint)
		if err = tx.SendBatch(ctx, b).Close(); err != nil {
			err = fmt.Errorf("look up event %s in %s: %w", id, cmd.Stream, err)
		}
	} else {
		in, err = s.EventIn(ctx, db, cmd.Stream, id)
	}
	if err != nil {
		res.Outcome, res.Err = CommandFailed, err
		return res
	}
	if in {
		s.metrics.dispatchDuplicates.Add(ctx, 1)
		res.Outcome = CommandDuplicate
		return res
	}
	r, err := target.Run(ctx, db, cmd.Stream, cmd.Command, RunOptions{EventIDs: []envelope.UUID{id}, Metadata: md})
	if isTx && err != nil {
		if _, rerr := tx.Exec(context.WithoutCancel(ctx), sqlDispatchRollback); rerr != nil {
			err = errors.Join(err, fmt.Errorf("roll back to savepoint: %w", rerr))
		}
	}
	switch {
	case err == nil && r.Duplicate:
		res.Outcome = CommandDuplicate
	case err == nil:
		res.Outcome, res.Result = CommandAppended, r
	case s.benignDuplicate(ctx, db, cmd.Stream, id, err):
		res.Outcome = CommandDuplicate
	default:
		res.Outcome, res.Err = CommandFailed, fmt.Errorf("dispatch command %s to %s: %w", id, cmd.Stream, err)
	}
	if res.Outcome == CommandDuplicate {
		s.metrics.dispatchDuplicates.Add(ctx, 1)
	}
	return res
}

// benignDuplicate is keiro's confirmBenignDuplicate: err is an event-id conflict and our id is
// stored in stream (a concurrent delivery appended it first). An id present only in another
// stream, or any other error, is not benign.
func (s *Store) benignDuplicate(ctx context.Context, db keiro.DB, stream string, id envelope.UUID, err error) bool {
	if !errors.Is(err, ErrEventIDConflict) {
		return false
	}
	in, lerr := s.EventIn(context.WithoutCancel(ctx), db, stream, id)
	return lerr == nil && in
}

// causedBy is the metadata of a dispatched command's events: caused by the source event.
func causedBy(source envelope.UUID) Metadata {
	if source.IsZero() {
		return Metadata{}
	}
	return Metadata{CausationID: &source}
}
