package main

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
)

// The orders aggregate: private domain events, state, commands and the decision.

// OrderEvent is one of the order's private events.
type OrderEvent interface{ isOrderEvent() }

// OrderPlaced records a new order.
type OrderPlaced struct {
	Customer string `json:"customer"`
	Items    []Item `json:"items"`
	Total    int64  `json:"totalCents"`
}

// OrderPaid records the payment of an order.
type OrderPaid struct {
	Amount int64 `json:"amountCents"`
}

// OrderCancelled records the cancellation of an unpaid order.
type OrderCancelled struct {
	Reason string `json:"reason"`
}

func (OrderPlaced) isOrderEvent()    {}
func (OrderPaid) isOrderEvent()      {}
func (OrderCancelled) isOrderEvent() {}

// Item is an order line.
type Item struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
	Price    int64  `json:"priceCents"`
}

// Status is an order's lifecycle state.
type Status string

// The order statuses.
const (
	StatusNone      Status = ""
	StatusPlaced    Status = "placed"
	StatusPaid      Status = "paid"
	StatusCancelled Status = "cancelled"
)

// Order is the state the order's events fold into.
type Order struct {
	Status Status `json:"status"`
	Total  int64  `json:"totalCents"`
}

// Commands.
type (
	// PlaceOrder places a new order.
	PlaceOrder struct {
		Customer string
		Items    []Item
	}
	// PayOrder pays a placed order in full.
	PayOrder struct{ Amount int64 }
	// CancelOrder cancels a placed, unpaid order.
	CancelOrder struct{ Reason string }
)

// ErrRejected marks a command the order's rules refuse.
var ErrRejected = errors.New("rejected")

// OrderDecider is the orders aggregate.
var OrderDecider = events.Decider[Order, any, OrderEvent]{
	Decide: func(o Order, cmd any) ([]OrderEvent, error) {
		switch c := cmd.(type) {
		case PlaceOrder:
			if o.Status != StatusNone {
				return nil, fmt.Errorf("%w: order already %s", ErrRejected, o.Status)
			}
			if len(c.Items) == 0 {
				return nil, fmt.Errorf("%w: an order needs at least one item", ErrRejected)
			}
			var total int64
			for _, it := range c.Items {
				total += it.Quantity * it.Price
			}
			return []OrderEvent{OrderPlaced{Customer: c.Customer, Items: c.Items, Total: total}}, nil
		case PayOrder:
			switch {
			case o.Status == StatusPaid:
				return nil, nil // paying twice is a no-op
			case o.Status != StatusPlaced:
				return nil, fmt.Errorf("%w: cannot pay an order that is %q", ErrRejected, o.Status)
			case c.Amount != o.Total:
				return nil, fmt.Errorf("%w: payment of %d does not match the total %d", ErrRejected, c.Amount, o.Total)
			}
			return []OrderEvent{OrderPaid{Amount: c.Amount}}, nil
		case CancelOrder:
			if o.Status != StatusPlaced {
				return nil, fmt.Errorf("%w: cannot cancel an order that is %q", ErrRejected, o.Status)
			}
			return []OrderEvent{OrderCancelled{Reason: c.Reason}}, nil
		}
		return nil, fmt.Errorf("%w: unknown command %T", ErrRejected, cmd)
	},
	Evolve: func(o Order, e OrderEvent) Order {
		switch e := e.(type) {
		case OrderPlaced:
			o.Status, o.Total = StatusPlaced, e.Total
		case OrderPaid:
			o.Status = StatusPaid
		case OrderCancelled:
			o.Status = StatusCancelled
		}
		return o
	},
}

// NewOrderCodec returns the codec of the order's private events.
func NewOrderCodec() (*events.JSONCodec[OrderEvent], error) {
	c := events.NewJSONCodec[OrderEvent]()
	return c, errors.Join(
		events.RegisterJSON[OrderPlaced](c, "OrderPlaced", 1),
		events.RegisterJSON[OrderPaid](c, "OrderPaid", 1),
		events.RegisterJSON[OrderCancelled](c, "OrderCancelled", 1),
	)
}

// Integration contract: what the ordering context publishes, on one topic keyed by order id so
// that an order's events stay in order.
const (
	// Source is the bounded context's name.
	Source = "ordering"
	// Topic carries the public order events.
	Topic = "ordering.orders.v1"
)

// publicOrder is the public payload: deliberately smaller than the private events.
type publicOrder struct {
	OrderID    string `json:"orderId"`
	Customer   string `json:"customer,omitempty"`
	TotalCents int64  `json:"totalCents,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// MapToIntegration maps private order events to public integration events. It is deterministic,
// as the integration producer requires.
func MapToIntegration(e events.RecordedEvent) ([]envelope.Event, error) {
	id := e.StreamName[len("order-"):]
	var (
		typ string
		pub = publicOrder{OrderID: id}
	)
	switch e.Type {
	case "OrderPlaced":
		var p OrderPlaced
		if err := json.Unmarshal(e.Data, &p); err != nil {
			return nil, err
		}
		typ, pub.Customer, pub.TotalCents = "OrderPlaced", p.Customer, p.Total
	case "OrderPaid":
		var p OrderPaid
		if err := json.Unmarshal(e.Data, &p); err != nil {
			return nil, err
		}
		typ, pub.TotalCents = "OrderPaid", p.Amount
	case "OrderCancelled":
		var p OrderCancelled
		if err := json.Unmarshal(e.Data, &p); err != nil {
			return nil, err
		}
		typ, pub.Reason = "OrderCancelled", p.Reason
	default:
		return nil, nil
	}
	payload, err := json.Marshal(pub)
	if err != nil {
		return nil, err
	}
	return []envelope.Event{{
		Destination: Topic, Key: &id, EventType: typ, SchemaVersion: 1,
		ContentType: envelope.ContentTypeJSON, Payload: payload,
	}}, nil
}
