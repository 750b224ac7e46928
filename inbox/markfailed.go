package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/internal/pgtext"
)

// ErrNotHandlerTx is returned by MarkFailedTx for a transaction that is not the one the inbox
// gave a single message's handler: a nested transaction, a BatchHandler's of several messages
// (which makes ProcessBatchWith run the batch again one message per transaction, where the mark
// applies), or any other.
var ErrNotHandlerTx = errors.New("inbox: not the transaction the inbox gave a message's handler")

// MarkFailedTx marks the inbox row of the message being handled failed, with reason as its last
// error, in tx, the transaction the inbox gave the Handler (keiro's markFailedTx). It is for a
// handler that judges its message bad yet must commit writes about it (a rejection recorded in
// its own tables, a reply event): the handler returns nil, its writes and the mark commit
// together, and the inbox keeps the mark instead of completing the row. Process reports the
// delivery Processed (the handler succeeded); the row is failed and poisoned, so a redelivery is
// PreviouslyFailed and never runs the handler again, and it waits in Admin.ListFailed for an
// operator (Admin.Reprocess runs it again; under DedupeOnly persistence the row keeps no
// payload to run). A handler that fails instead returns an error: its writes roll back and the
// inbox records the attempt. MarkFailedTx returns ErrNotHandlerTx when tx is not a single
// message's handler transaction.
func MarkFailedTx(ctx context.Context, tx pgx.Tx, reason string) error {
	htx, ok := tx.(*handlerTx)
	if !ok || htx.row == nil {
		return ErrNotHandlerTx
	}
	r := htx.row
	if _, err := htx.Tx.Exec(ctx, r.s.sql.markFailed, r.s.cfg.Consumer, r.source, r.key, pgtext.Storable(reason, maxErrorLen)); err != nil {
		return fmt.Errorf("mark inbox row %s/%s failed: %w", r.source, r.key, err)
	}
	r.failed = true
	return nil
}
