package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/envelope"
)

// ErrOutboxIDTaken reports an EnqueueWithIDsTx whose outbox id is already the id of a row with
// another (source, message id): the producer's identity inputs collide with an earlier row's,
// typically because the message id prefix changed. The transaction is aborted.
var ErrOutboxIDTaken = errors.New("outbox id already used by another message")

// EnqueueWithIDsTx is [Store.EnqueueTx] with the outbox ids chosen by the caller: ids[i] is the
// row id of events[i]. Producers that derive a deterministic id from the event's identity
// (keiro's UUIDv8 of the producer identity, events.NewProducerIdentity) use it so that the same
// event maps to the same row id in every service and language. Ids must be distinct and not
// zero. A Duplicate reports the retained row's id. The row id plays no part in ordering (the
// relay orders by the row's seq), so ids need not be time-ordered.
func (s *Store) EnqueueWithIDsTx(ctx context.Context, tx pgx.Tx, ids []envelope.UUID, events ...envelope.Event) ([]EnqueueResult, error) {
	if len(ids) != len(events) {
		return nil, fmt.Errorf("enqueue outbox events: %d outbox ids for %d events; give one id per event", len(ids), len(events))
	}
	seen := make(map[envelope.UUID]int, len(ids))
	for i, id := range ids {
		if id.IsZero() {
			return nil, fmt.Errorf("enqueue outbox events: outbox id %d is the zero UUID; derive one or use EnqueueTx", i)
		}
		if j, ok := seen[id]; ok {
			return nil, fmt.Errorf("enqueue outbox events: events %d and %d have the same outbox id %s", j, i, id)
		}
		seen[id] = i
	}
	return s.enqueueTx(ctx, tx, ids, events)
}

// enqueueError wraps an enqueue statement's error, naming an outbox id collision.
func enqueueError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "keiro_outbox_pkey" {
		return fmt.Errorf("enqueue outbox events: %w (%s); the transaction is aborted: %w", ErrOutboxIDTaken, pgErr.Detail, err)
	}
	return fmt.Errorf("enqueue outbox events: %w", err)
}
