package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
)

// MaxRejectionDetail is the longest Rejection.Detail, in bytes (keiro's limit).
const MaxRejectionDetail = 1024

// rejectionCode is the rejection_code column's rule (migration 001), keiro's.
var rejectionCode = regexp.MustCompile(`^[a-z][a-z0-9._-]{0,63}$`)

// ErrInvalidRejection reports a Rejection that breaks keiro's rules for its code or detail.
var ErrInvalidRejection = errors.New("invalid outbox rejection")

// Rejection is why a caller sets outbox rows aside for good (keiro's PublishRejection): the
// rows end 'rejected', as rows Kafka refuses do, with the caller's code and detail.
type Rejection struct {
	// Code classifies the rejection, for example "policy.pii": a lowercase letter, then at most
	// 63 lowercase letters, digits, '.', '_' or '-'. It is stored as rejection_code. Required.
	Code string
	// Detail tells an operator what was wrong: at most MaxRejectionDetail bytes of UTF-8, without
	// NUL. It is stored as the row's last_error. Defaults to "" (none).
	Detail string
}

// Validate reports every problem of r at once, each wrapping ErrInvalidRejection.
func (r Rejection) Validate() error {
	var errs []error
	if !rejectionCode.MatchString(r.Code) {
		errs = append(errs, fmt.Errorf("%w: Code %q: use a lowercase letter, then up to 63 lowercase letters, digits, '.', '_' or '-'", ErrInvalidRejection, r.Code))
	}
	switch {
	case len(r.Detail) > MaxRejectionDetail:
		errs = append(errs, fmt.Errorf("%w: Detail: %d bytes, more than %d", ErrInvalidRejection, len(r.Detail), MaxRejectionDetail))
	case !utf8.ValidString(r.Detail) || strings.ContainsRune(r.Detail, 0):
		errs = append(errs, fmt.Errorf("%w: Detail: not UTF-8 text without NUL", ErrInvalidRejection))
	}
	return errors.Join(errs...)
}

// Reject makes the pending and failed rows among ids terminal 'rejected' with r's code and
// detail, and returns the ids it rejected, in seq order; the others (missing, in flight, sent,
// dead or already rejected) are left alone. It is keiro's caller-side PublishRejected: a
// service or an operator decides that a message must not be published (a policy it breaks, a
// destination withdrawn). Like a rejection by Kafka it does not block its key: the rows after
// it on its key (or source stream) publish, and the rejected row waits for an operator in
// ListDead, from where Requeue brings it back. On q, a transaction of the caller's, the
// rejection commits with it. Rows of a schema in log mode are published from the replication
// slot, not from keiro_outbox, and cannot be rejected.
func (a *Admin) Reject(ctx context.Context, q keiro.DB, ids []envelope.UUID, r Rejection) ([]envelope.UUID, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("reject outbox rows: %w", err)
	}
	raw := make([][16]byte, len(ids))
	for i, id := range ids {
		raw[i] = id
	}
	rows, err := q.Query(ctx, a.q.Reject, raw, r.Code, nullString(r.Detail))
	if err != nil {
		return nil, fmt.Errorf("reject outbox rows: %w", err)
	}
	rejected, err := pgx.CollectRows(rows, scanID)
	if err != nil {
		return nil, fmt.Errorf("reject outbox rows: %w", err)
	}
	return rejected, nil
}
