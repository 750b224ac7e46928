package handlers

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
)

// ForwardFunc maps a consumed event to the events to publish because of it: none, one or
// several. An event it returns without a MessageID gets ForwardedMessageID(consumed, i), i its
// index in the result. An error wrapped with inbox.Permanent dead-letters the consumed record;
// any other error is retried.
type ForwardFunc func(ctx context.Context, consumed envelope.Event) ([]envelope.Event, error)

// Forward returns an inbox handler that enqueues the events fn maps each consumed event to
// into the outbox of out, in the inbox transaction: the consume → produce pattern (an
// NServiceBus-style outbox on the receiving side). The inbox row of the consumed event and the
// outbox rows of the events it causes commit together or not at all, so a record read from one
// topic yields its outbox rows once, and the relay publishes each of them (exactly once on the
// destination topic when the relay publishes in Kafka transactions, at least once otherwise):
//
//   - a redelivered record finds its completed inbox row and the handler does not run again;
//   - past the inbox's dedupe window, the derived message ids still make the enqueue a
//     duplicate (the outbox is idempotent on source and message id while the row is retained);
//   - a handler failure rolls back both, and the record is retried as a whole.
//
// A mapped event that is not valid, or whose message id the outbox already holds with other
// content (outbox.ErrIdentityConflict), fails permanently: the record is dead-lettered, since
// the same input would fail again. Database errors are retried. A nil out enqueues through
// the package-level outbox.EnqueueTx (the keiro_outbox table on the transaction's search_path,
// else schema keiro). Forward returns an error when fn is nil.
func Forward(out *outbox.Store, fn ForwardFunc) (inbox.Handler, error) {
	if fn == nil {
		return nil, errors.New("forward handler: fn is required; map each consumed event to the events to publish")
	}
	enqueue := outbox.EnqueueTx
	if out != nil {
		enqueue = out.EnqueueTx
	}
	return func(ctx context.Context, tx pgx.Tx, consumed envelope.Event) error {
		evs, err := fn(ctx, consumed)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			return nil
		}
		for i := range evs {
			if evs[i].MessageID == "" {
				evs[i].MessageID = ForwardedMessageID(consumed, i)
			}
			if err := evs[i].Validate(); err != nil {
				return inbox.Permanent(fmt.Errorf("forward message %q: event %d is not valid: %w", consumed.MessageID, i, err))
			}
		}
		if _, err := enqueue(ctx, tx, evs...); err != nil {
			err = fmt.Errorf("forward message %q: %w", consumed.MessageID, err)
			if errors.Is(err, outbox.ErrIdentityConflict) {
				return inbox.Permanent(err)
			}
			return err
		}
		return nil
	}, nil
}

// ForwardedMessageID is the message id Forward gives the i-th event caused by consumed when
// its ForwardFunc leaves the id empty: a UUID derived from consumed's source and message id
// and i, the same every time the record is processed, so a repeated enqueue is a duplicate in
// the outbox rather than a second event. Tests use it to name the events they expect.
func ForwardedMessageID(consumed envelope.Event, i int) string {
	h := sha256.New()
	for _, s := range []string{"keiro-forward", consumed.Source, consumed.MessageID} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
		h.Write([]byte(s))
	}
	_ = binary.Write(h, binary.BigEndian, uint64(i))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8: custom
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
