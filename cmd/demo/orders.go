package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/schema"
)

// The orders context keeps one stream per customer ("customer-c007"): the customer's orders
// in the order they were committed. The stream version of an OrderPlaced event is therefore
// the customer's order sequence number, 1, 2, 3, … in commit order, and it travels in the
// integration event so that billing can check it applies a customer's orders in that order.

// Customer is the state of a customer stream.
type Customer struct {
	// Orders is the number of orders placed.
	Orders int64
}

// PlaceOrder is the orders context's command.
type PlaceOrder struct {
	OrderID string
	Amount  int64
}

// OrderEvent is the orders context's private event sum type.
type OrderEvent interface{ isOrderEvent() }

// OrderPlaced is the private event of a placed order.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

func (OrderPlaced) isOrderEvent() {}

// OrderPlacedV1 is the integration event billing consumes (topic DefaultTopic).
type OrderPlacedV1 struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	CustomerSeq int64  `json:"customer_seq"`
	Amount      int64  `json:"amount"`
}

// orderPlacedAvro is OrderPlacedV1's Avro schema.
const orderPlacedAvro = `{"type":"record","name":"OrderPlaced","namespace":"keiro.demo.orders.v1","fields":[
 {"name":"order_id","type":"string"},{"name":"customer","type":"string"},
 {"name":"customer_seq","type":"long"},{"name":"amount","type":"long"}]}`

var customerDecider = events.Decider[Customer, PlaceOrder, OrderEvent]{
	Decide: func(_ Customer, cmd PlaceOrder) ([]OrderEvent, error) {
		if cmd.Amount <= 0 {
			return nil, fmt.Errorf("order %s: amount must be positive", cmd.OrderID)
		}
		return []OrderEvent{OrderPlaced{OrderID: cmd.OrderID, Amount: cmd.Amount}}, nil
	},
	Evolve: func(s Customer, e OrderEvent) Customer {
		if _, ok := e.(OrderPlaced); ok {
			s.Orders++
		}
		return s
	},
}

// payloadCodec fills an integration event's payload.
type payloadCodec interface {
	encode(ctx context.Context, ev *envelope.Event, v OrderPlacedV1) error
}

type jsonPayload struct{}

func (jsonPayload) encode(_ context.Context, ev *envelope.Event, v OrderPlacedV1) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode OrderPlaced as JSON: %w", err)
	}
	ev.Payload, ev.ContentType = b, envelope.ContentTypeJSON
	return nil
}

type avroPayload struct{ ser *schema.Serializer }

func (a avroPayload) encode(ctx context.Context, ev *envelope.Event, v OrderPlacedV1) error {
	return a.ser.Encode(ctx, ev, map[string]any{
		"order_id": v.OrderID, "customer": v.Customer, "customer_seq": v.CustomerSeq, "amount": v.Amount,
	})
}

// newAvroPayload returns the Avro payload codec and the consumer's decoding hook (Avro to
// JSON, so the billing handler reads the same document either way).
func newAvroPayload(url string) (payloadCodec, func(context.Context, *envelope.Event) error, error) {
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: url})
	if err != nil {
		return nil, nil, fmt.Errorf("schema registry: %w", err)
	}
	// AutoRegister suits a demo; production registers with `relay schema register`.
	ser, err := schema.NewSerializer(reg, orderPlacedAvro, schema.SerializerConfig{AutoRegister: true})
	if err != nil {
		return nil, nil, fmt.Errorf("avro serializer: %w", err)
	}
	de, err := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	if err != nil {
		return nil, nil, fmt.Errorf("avro deserializer: %w", err)
	}
	return avroPayload{ser: ser}, de.EventHook(), nil
}

// ordersContext places orders through the command runner; its hook enqueues the integration
// event in the same transaction as the private event.
type ordersContext struct {
	runner *events.Runner[Customer, PlaceOrder, OrderEvent]

	mu  sync.Mutex
	seq map[string]int64 // customer → last committed sequence number
}

func newOrders(dbSchema string, ob *outbox.Store, topic string, codec payloadCodec) (*ordersContext, error) {
	store, err := events.NewStore(events.StoreConfig{Schema: dbSchema})
	if err != nil {
		return nil, fmt.Errorf("event store: %w", err)
	}
	jc := events.NewJSONCodec[OrderEvent]()
	if err := events.RegisterJSON[OrderPlaced](jc, "OrderPlaced", 1); err != nil {
		return nil, fmt.Errorf("register OrderPlaced: %w", err)
	}
	hook := func(ctx context.Context, tx pgx.Tx, res events.Result) error {
		for _, e := range res.Events {
			var p OrderPlaced
			if err := json.Unmarshal(e.Data, &p); err != nil {
				return fmt.Errorf("decode %s: %w", e.Type, err)
			}
			customer := strings.TrimPrefix(e.StreamName, "customer-")
			id, pos := e.ID, e.GlobalPosition
			ev := envelope.Event{
				MessageID:            e.ID.String(),
				Source:               Source,
				Destination:          topic,
				Key:                  &customer,
				EventType:            "OrderPlaced",
				SchemaVersion:        1,
				SourceEventID:        &id,
				SourceGlobalPosition: &pos,
				OccurredAt:           e.RecordedAt,
				TraceContext:         e.Metadata.TraceContext,
			}
			v := OrderPlacedV1{OrderID: p.OrderID, Customer: customer, CustomerSeq: e.StreamVersion, Amount: p.Amount}
			if err := codec.encode(ctx, &ev, v); err != nil {
				return err
			}
			if _, err := ob.EnqueueTx(ctx, tx, ev); err != nil {
				return fmt.Errorf("enqueue OrderPlaced %s: %w", p.OrderID, err)
			}
		}
		return nil
	}
	runner, err := events.NewRunner(store, customerDecider, events.Codec[OrderEvent](jc), events.RunnerConfig[Customer]{
		Hooks:      []events.Hook{hook},
		RetryLimit: 50, // producers contend on hot customers on purpose
	})
	if err != nil {
		return nil, fmt.Errorf("command runner: %w", err)
	}
	return &ordersContext{runner: runner, seq: map[string]int64{}}, nil
}

func (o *ordersContext) place(ctx context.Context, db keiro.DB, customer string, cmd PlaceOrder) error {
	res, err := o.runner.Run(ctx, db, events.StreamName("customer", customer), cmd)
	if err != nil {
		return err
	}
	if len(res.Events) == 0 {
		return errors.New("the command appended no event")
	}
	o.mu.Lock()
	o.seq[customer] = max(o.seq[customer], res.StreamVersion)
	o.mu.Unlock()
	return nil
}

// placedPerCustomer returns each customer's number of committed orders.
func (o *ordersContext) placedPerCustomer() map[string]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]int64, len(o.seq))
	for k, v := range o.seq {
		out[k] = v
	}
	return out
}
