package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/keiro-go/keiro/events"
)

// SubscriptionDeadLetters answers GET /api/v1/subscriptions/dead-letters: the event store's
// subscription dead letters (events.Store.ListDeadLetters), oldest first.
type SubscriptionDeadLetters struct {
	// Rows are the page's dead letters, in id order.
	Rows []events.DeadLetter `json:"rows"`
	// NextCursor continues the listing (?cursor=); empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// subDeadLetterFilter is the query of a subscription dead-letter listing.
type subDeadLetterFilter struct {
	Subscription string
	Status       string
	After        int64
	Limit        int
}

func parseSubDeadLetterFilter(r *http.Request) (subDeadLetterFilter, error) {
	q := r.URL.Query()
	f := subDeadLetterFilter{Subscription: strings.TrimSpace(q.Get("subscription")), Status: strings.TrimSpace(q.Get("status"))}
	var err error
	if f.Limit, err = pageSize(r); err != nil {
		return f, err
	}
	switch f.Status {
	case "", events.DeadLetterDead, events.DeadLetterReplay, events.DeadLetterReplayed:
	default:
		return f, fmt.Errorf("status %q is not dead, replay or replayed", f.Status)
	}
	if s := q.Get("cursor"); s != "" {
		if f.After, err = strconv.ParseInt(s, 10, 64); err != nil || f.After < 0 {
			return f, fmt.Errorf("cursor %q is not one this API returned: start again without it", s)
		}
	}
	return f, nil
}

func (c *Console) listSubDeadLetters(ctx context.Context, f subDeadLetterFilter) (SubscriptionDeadLetters, error) {
	rows, err := c.events.ListDeadLetters(ctx, c.cfg.Events.Pool, events.DeadLetterFilter{
		Subscription: f.Subscription, Status: f.Status, AfterID: f.After, Limit: f.Limit + 1,
	})
	out := SubscriptionDeadLetters{Rows: []events.DeadLetter{}}
	if err != nil {
		return out, err
	}
	if len(rows) > f.Limit {
		rows = rows[:f.Limit]
		out.NextCursor = strconv.FormatInt(rows[f.Limit-1].ID, 10)
	}
	out.Rows = append(out.Rows, rows...)
	return out, nil
}

// SubscriptionReplayRequest is the body of POST /api/v1/subscriptions/dead-letters/replay.
type SubscriptionReplayRequest struct {
	// Subscription is the subscription whose dead letters are replayed. Required.
	Subscription string `json:"subscription"`
	// IDs are the dead letters to deliver again (at most MaxSelection); or All.
	IDs []int64 `json:"ids,omitempty"`
	// All replays every dead letter of the subscription in status dead.
	All bool `json:"all,omitempty"`
}

func (q SubscriptionReplayRequest) validate() error {
	var errs []error
	if strings.TrimSpace(q.Subscription) == "" {
		errs = append(errs, errors.New("subscription is required"))
	}
	if q.All == (len(q.IDs) > 0) {
		errs = append(errs, errors.New("give either ids or all"))
	}
	if len(q.IDs) > MaxSelection {
		errs = append(errs, fmt.Errorf("at most %d ids per request, got %d", MaxSelection, len(q.IDs)))
	}
	for i, id := range q.IDs {
		if id < 1 {
			errs = append(errs, fmt.Errorf("ids[%d]: %d is not a dead letter id", i, id))
		}
	}
	return errors.Join(errs...)
}

// SubscriptionReplayAnswer answers a subscription replay request.
type SubscriptionReplayAnswer struct {
	// Subscription is the subscription asked.
	Subscription string `json:"subscription"`
	// Requested counts the dead letters now waiting for the running subscription to deliver
	// them again (status replay); named rows not in status dead are left alone.
	Requested int64 `json:"requested"`
	// Note says who delivers them.
	Note string `json:"note"`
}

// subReplayNote says who delivers a requested replay.
const subReplayNote = "the running subscription delivers them, one transaction each and out of log order; a success marks the row replayed, a failure puts it back to dead with the new error"

func (c *Console) replaySubDeadLetters(r *http.Request, q SubscriptionReplayRequest) (SubscriptionReplayAnswer, error) {
	n, err := c.events.RequestReplay(r.Context(), c.cfg.Events.Pool, q.Subscription, q.IDs...)
	c.action(r, "subscription dead-letter replay", "subscription", q.Subscription, "ids", len(q.IDs), "all", q.All,
		"requested", n, "err", err)
	if err != nil {
		return SubscriptionReplayAnswer{}, err
	}
	return SubscriptionReplayAnswer{Subscription: q.Subscription, Requested: n, Note: subReplayNote}, nil
}
