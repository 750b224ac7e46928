package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
)

// Billing's invoices: opened for an order, then paid or voided.
type (
	InvoiceOpened struct{ Amount int }
	InvoicePaid   struct{}
	InvoiceVoided struct{}
	Invoice       struct{ Status string }
	// InvoiceCmd is "open", "pay" or "void".
	InvoiceCmd struct {
		Op     string
		Amount int
	}
)

// The payment saga's inputs (integration events from ordering and payments, and its timer),
// its events and its state.
type (
	PaymentInput struct {
		Kind   string // "OrderPlaced", "PaymentCaptured", "PaymentTimeout"
		Order  string
		Amount int
		At     time.Time
	}
	SagaStarted  struct{ Amount int }
	SagaPaid     struct{}
	SagaTimedOut struct{}
	Saga         struct{ Started, Paid, TimedOut bool }
)

// paymentSaga is pure: the reaction depends on the state and the input only.
func paymentSaga(s Saga, in PaymentInput) (events.Reaction[any, InvoiceCmd], error) {
	invoice := events.StreamName("invoice", in.Order)
	switch in.Kind {
	case "OrderPlaced":
		if s.Started {
			return events.Reaction[any, InvoiceCmd]{}, nil
		}
		payload, _ := json.Marshal(map[string]string{"order": in.Order})
		return events.Reaction[any, InvoiceCmd]{
			Events:   []any{SagaStarted{in.Amount}},
			Commands: []events.Command[InvoiceCmd]{{Stream: invoice, Command: InvoiceCmd{Op: "open", Amount: in.Amount}}},
			Timers: []events.TimerRequest{{ID: events.TimerID("payment", in.Order, "payment timeout"),
				FireAt: in.At.Add(30 * time.Minute), Payload: payload}},
		}, nil
	case "PaymentCaptured":
		if !s.Started || s.Paid || s.TimedOut {
			return events.Reaction[any, InvoiceCmd]{}, nil
		}
		return events.Reaction[any, InvoiceCmd]{Events: []any{SagaPaid{}},
			Commands: []events.Command[InvoiceCmd]{{Stream: invoice, Command: InvoiceCmd{Op: "pay"}}}}, nil
	case "PaymentTimeout":
		if s.Paid || s.TimedOut {
			return events.Reaction[any, InvoiceCmd]{}, nil // paid in time: the timer has nothing to do
		}
		return events.Reaction[any, InvoiceCmd]{Events: []any{SagaTimedOut{}},
			Commands: []events.Command[InvoiceCmd]{{Stream: invoice, Command: InvoiceCmd{Op: "void"}}}}, nil
	}
	return events.Reaction[any, InvoiceCmd]{}, fmt.Errorf("unknown input %q", in.Kind)
}

// Example_processManager runs a payment saga: an order placed opens an invoice and arms a
// 30-minute payment timeout; a captured payment marks the invoice paid; the timeout voids the
// invoices still unpaid. Redeliveries change nothing.
func Example_processManager() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB()
	defer cleanup()
	store, err := events.NewStore(events.StoreConfig{Schema: schema})
	if err != nil {
		panic(err)
	}

	invoiceCodec := events.NewJSONCodec[any]()
	_ = events.RegisterJSON[InvoiceOpened](invoiceCodec, "InvoiceOpened", 1)
	_ = events.RegisterJSON[InvoicePaid](invoiceCodec, "InvoicePaid", 1)
	_ = events.RegisterJSON[InvoiceVoided](invoiceCodec, "InvoiceVoided", 1)
	invoices, err := events.NewRunner(store, events.Decider[Invoice, InvoiceCmd, any]{
		Decide: func(inv Invoice, c InvoiceCmd) ([]any, error) {
			switch {
			case c.Op == "open" && inv.Status == "":
				return []any{InvoiceOpened{c.Amount}}, nil
			case c.Op == "pay" && inv.Status == "open":
				return []any{InvoicePaid{}}, nil
			case c.Op == "void" && inv.Status == "open":
				return []any{InvoiceVoided{}}, nil
			}
			return nil, fmt.Errorf("cannot %s an invoice that is %q", c.Op, inv.Status)
		},
		Evolve: func(inv Invoice, e any) Invoice {
			switch e.(type) {
			case InvoiceOpened:
				inv.Status = "open"
			case InvoicePaid:
				inv.Status = "paid"
			case InvoiceVoided:
				inv.Status = "void"
			}
			return inv
		},
	}, invoiceCodec, events.RunnerConfig[Invoice]{})
	if err != nil {
		panic(err)
	}

	sagaCodec := events.NewJSONCodec[any]()
	_ = events.RegisterJSON[SagaStarted](sagaCodec, "SagaStarted", 1)
	_ = events.RegisterJSON[SagaPaid](sagaCodec, "SagaPaid", 1)
	_ = events.RegisterJSON[SagaTimedOut](sagaCodec, "SagaTimedOut", 1)
	pm, err := events.NewProcessManager(store, events.ProcessManagerConfig[Saga, PaymentInput, any, InvoiceCmd]{
		Name:      "payment",
		Correlate: func(in PaymentInput) string { return in.Order },
		Handle:    paymentSaga,
		Evolve: func(s Saga, e any) Saga {
			switch e.(type) {
			case SagaStarted:
				s.Started = true
			case SagaPaid:
				s.Paid = true
			case SagaTimedOut:
				s.TimedOut = true
			}
			return s
		},
		Codec:  sagaCodec,
		Target: invoices,
	})
	if err != nil {
		panic(err)
	}

	// In a service these come from the inbox (pm.InboxHandler) or a subscription
	// (pm.EventHandler), each message with its own stable id.
	placedAt := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	inputs := []struct {
		id envelope.UUID
		in PaymentInput
	}{
		{envelope.NewUUIDv7(), PaymentInput{Kind: "OrderPlaced", Order: "o1", Amount: 40, At: placedAt}},
		{envelope.NewUUIDv7(), PaymentInput{Kind: "OrderPlaced", Order: "o2", Amount: 25, At: placedAt}},
		{envelope.NewUUIDv7(), PaymentInput{Kind: "PaymentCaptured", Order: "o1"}},
	}
	inputs = append(inputs, inputs[0]) // a redelivery
	for _, m := range inputs {
		res, err := pm.Dispatch(ctx, pool, m.id, m.in)
		if err == nil {
			err = res.Err()
		}
		if err != nil {
			panic(err)
		}
		fmt.Println(m.in.Kind, m.in.Order+":", "step", res.Manager.Outcome, "commands", len(res.Commands), "timers", res.TimersScheduled)
	}

	// Thirty-one minutes later the timer worker delivers the timeouts to the saga.
	fire, err := pm.TimerFire(func(t events.Timer) (PaymentInput, error) {
		return PaymentInput{Kind: "PaymentTimeout", Order: t.CorrelationID}, nil
	}, events.DispatchPolicy{})
	if err != nil {
		panic(err)
	}
	worker, err := events.NewTimerWorker(store, pool, events.TimerWorkerConfig{Fire: fire,
		Now: func() time.Time { return placedAt.Add(31 * time.Minute) }})
	if err != nil {
		panic(err)
	}
	for {
		outcome, t, err := worker.RunOnce(ctx)
		if err != nil {
			panic(err)
		}
		if outcome == events.TimerIdle {
			break
		}
		fmt.Println("timer of", t.CorrelationID, outcome, "with a saga event:", t.FiredEventID != nil)
	}
	for _, order := range []string{"o1", "o2"} {
		inv, _, err := invoices.Load(ctx, pool, events.StreamName("invoice", order))
		if err != nil {
			panic(err)
		}
		saga, version, _ := pm.Load(ctx, pool, order)
		fmt.Printf("%s: invoice %s, saga %+v at version %d\n", order, inv.Status, saga, version)
	}
	// Output:
	// OrderPlaced o1: step appended commands 1 timers 1
	// OrderPlaced o2: step appended commands 1 timers 1
	// PaymentCaptured o1: step appended commands 1 timers 0
	// OrderPlaced o1: step duplicate commands 1 timers 0
	// timer of o1 fired with a saga event: false
	// timer of o2 fired with a saga event: true
	// o1: invoice paid, saga {Started:true Paid:true TimedOut:false} at version 2
	// o2: invoice void, saga {Started:true Paid:false TimedOut:true} at version 2
}
