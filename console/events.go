package console

import (
	"context"
	"fmt"
	"time"
)

// Subscriptions answers GET /api/v1/subscriptions.
type Subscriptions struct {
	// Head is the newest committed global position of the event store.
	Head int64 `json:"head"`
	// Subscriptions lists the subscriptions by name (at most MaxPageSize).
	Subscriptions []SubscriptionState `json:"subscriptions"`
	// ReadAt is when the positions were read.
	ReadAt time.Time `json:"read_at"`
}

// SubscriptionState is one subscription's checkpoint.
type SubscriptionState struct {
	// Name is the subscription's name.
	Name string `json:"name"`
	// Position is the last global position whose effects are committed.
	Position int64 `json:"position"`
	// Distance is Head minus Position: the events still to process.
	Distance int64 `json:"distance"`
	// UpdatedAt is when the checkpoint last moved.
	UpdatedAt time.Time `json:"updated_at"`
	// RebuiltAt is when the subscription was last rebuilt, if ever.
	RebuiltAt *time.Time `json:"rebuilt_at,omitempty"`
}

func (c *Console) readSubscriptions(ctx context.Context) (Subscriptions, error) {
	ec := c.cfg.Events
	out := Subscriptions{Subscriptions: []SubscriptionState{}, ReadAt: time.Now().UTC()}
	head, err := c.events.Head(ctx, ec.Pool)
	if err != nil {
		return out, err
	}
	out.Head = head
	rows, err := ec.Pool.Query(ctx, bind(sqlSubscriptions, ec.Schema, "keiro_subscriptions"), MaxPageSize)
	if err != nil {
		return out, fmt.Errorf("list subscriptions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s SubscriptionState
		if err := rows.Scan(&s.Name, &s.Position, &s.UpdatedAt, &s.RebuiltAt); err != nil {
			return out, fmt.Errorf("list subscriptions: %w", err)
		}
		s.Distance = max(head-s.Position, 0)
		out.Subscriptions = append(out.Subscriptions, s)
	}
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("list subscriptions: %w", err)
	}
	return out, nil
}
