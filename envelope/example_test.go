package envelope_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

// Encode an event into keiro's Kafka headers and decode it back, as a keiro consumer would.
func Example() {
	key := "order-123"
	e, err := envelope.EncodeJSON(envelope.Event{
		MessageID:     "018f0f18-17aa-7000-8000-0000000000aa",
		Source:        "ordering",
		Destination:   "billing.orders.v1",
		Key:           &key,
		EventType:     "OrderSubmitted",
		SchemaVersion: 1,
		OccurredAt:    time.Date(2023, 2, 25, 0, 0, 0, 0, time.UTC),
	}, map[string]any{"orderId": "order-123", "quantity": 5})
	if err != nil {
		panic(err)
	}
	if err := e.Validate(); err != nil {
		panic(err)
	}

	rec := e.Record(envelope.EncodeOptions{})
	for _, h := range rec.Headers {
		fmt.Printf("%s: %s\n", h.Key, h.Value)
	}

	got, err := envelope.Decode(rec)
	if err != nil {
		panic(err)
	}
	var payload struct {
		OrderID  string `json:"orderId"`
		Quantity int    `json:"quantity"`
	}
	if err := envelope.DecodeJSON(&got, &payload); err != nil {
		panic(err)
	}
	fmt.Println(*got.Key, got.EventType, payload.OrderID, payload.Quantity)
	// Output:
	// keiro-message-id: 018f0f18-17aa-7000-8000-0000000000aa
	// keiro-source: ordering
	// keiro-destination: billing.orders.v1
	// keiro-event-type: OrderSubmitted
	// keiro-schema-version: 1
	// content-type: application/json
	// keiro-occurred-at: 2023-02-25T00:00:00Z
	// order-123 OrderSubmitted order-123 5
}

// Decode errors name the header; errors.Is classifies them.
func ExampleDecode_error() {
	_, err := envelope.Decode(envelope.Record{Headers: []envelope.Header{
		{Key: envelope.HeaderSource, Value: []byte("ordering")},
		{Key: envelope.HeaderDestination, Value: []byte("billing.orders.v1")},
		{Key: envelope.HeaderEventType, Value: []byte("OrderSubmitted")},
		{Key: envelope.HeaderSchemaVersion, Value: []byte("v1")},
	}})
	fmt.Println(err)
	fmt.Println(errors.Is(err, envelope.ErrInvalidIntHeader))
	// Output:
	// envelope: invalid integer header "keiro-schema-version": "v1"
	// true
}
