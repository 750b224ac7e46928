package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
)

// The payment saga, billing's process manager: an order placed (from Kafka, in the inbox
// transaction) opens the order's settlement and arms a payment timeout; the payments context
// captures most orders' payments; the timeout voids the settlements still open. Every saga ends
// in exactly one state, and every settlement holds exactly its two events.

// PaymentTimeout is how long the saga waits for a payment (short, for the demo).
const PaymentTimeout = 4 * time.Second

// sagaInput is one input of the payment saga.
type sagaInput struct {
	Kind   string // "OrderPlaced", "PaymentCaptured", "PaymentTimeout"
	Order  string
	Amount int64
	At     time.Time
}

// The saga's events and state.
type (
	SagaOpened   struct{ Amount int64 }
	SagaPaid     struct{}
	SagaTimedOut struct{}
	sagaState    struct{ Opened, Paid, TimedOut bool }
)

// The settlement aggregate ("settlement-<order>"): opened, then captured or voided, once.
type (
	SettlementOpened   struct{ Amount int64 }
	SettlementCaptured struct{}
	SettlementVoided   struct{}
	settlement         struct{ Status string }
	settlementCmd      struct {
		Op     string // "open", "capture", "void"
		Amount int64
	}
)

func sagaHandle(s sagaState, in sagaInput) (events.Reaction[any, settlementCmd], error) {
	target := events.StreamName("settlement", in.Order)
	none := events.Reaction[any, settlementCmd]{}
	switch in.Kind {
	case "OrderPlaced":
		if s.Opened {
			return none, nil
		}
		return events.Reaction[any, settlementCmd]{Events: []any{SagaOpened{in.Amount}},
			Commands: []events.Command[settlementCmd]{{Stream: target, Command: settlementCmd{Op: "open", Amount: in.Amount}}},
			Timers: []events.TimerRequest{{ID: events.TimerID("payment", in.Order, "payment timeout"),
				FireAt: in.At.Add(PaymentTimeout)}}}, nil
	case "PaymentCaptured":
		if !s.Opened || s.Paid || s.TimedOut {
			return none, nil
		}
		return events.Reaction[any, settlementCmd]{Events: []any{SagaPaid{}},
			Commands: []events.Command[settlementCmd]{{Stream: target, Command: settlementCmd{Op: "capture"}}}}, nil
	case "PaymentTimeout":
		if s.Paid || s.TimedOut {
			return none, nil
		}
		return events.Reaction[any, settlementCmd]{Events: []any{SagaTimedOut{}},
			Commands: []events.Command[settlementCmd]{{Stream: target, Command: settlementCmd{Op: "void"}}}}, nil
	}
	return none, fmt.Errorf("payment saga: unknown input %q", in.Kind)
}

func sagaEvolve(s sagaState, e any) sagaState {
	switch e.(type) {
	case SagaOpened:
		s.Opened = true
	case SagaPaid:
		s.Paid = true
	case SagaTimedOut:
		s.TimedOut = true
	}
	return s
}

var settlementDecider = events.Decider[settlement, settlementCmd, any]{
	Decide: func(s settlement, c settlementCmd) ([]any, error) {
		switch {
		case c.Op == "open" && s.Status == "":
			return []any{SettlementOpened{c.Amount}}, nil
		case c.Op == "capture" && s.Status == "open":
			return []any{SettlementCaptured{}}, nil
		case c.Op == "void" && s.Status == "open":
			return []any{SettlementVoided{}}, nil
		}
		return nil, fmt.Errorf("cannot %s a settlement that is %q", c.Op, s.Status)
	},
	Evolve: func(s settlement, e any) settlement {
		switch e.(type) {
		case SettlementOpened:
			s.Status = "open"
		case SettlementCaptured:
			s.Status = "captured"
		case SettlementVoided:
			s.Status = "void"
		}
		return s
	},
}

// payment is the saga with its settlements and timer workers.
type payment struct {
	store       *events.Store
	pm          *events.ProcessManager[sagaState, sagaInput, any, settlementCmd]
	settlements *events.Runner[settlement, settlementCmd, any]
	workers     []*events.TimerWorker
	schema      string
}

func newPayment(schema string, pool *pgxpool.Pool) (*payment, error) {
	store, err := events.NewStore(events.StoreConfig{Schema: schema})
	if err != nil {
		return nil, err
	}
	sc := events.NewJSONCodec[any]()
	pc := events.NewJSONCodec[any]()
	errs := []error{
		events.RegisterJSON[SettlementOpened](sc, "SettlementOpened", 1),
		events.RegisterJSON[SettlementCaptured](sc, "SettlementCaptured", 1),
		events.RegisterJSON[SettlementVoided](sc, "SettlementVoided", 1),
		events.RegisterJSON[SagaOpened](pc, "SagaOpened", 1),
		events.RegisterJSON[SagaPaid](pc, "SagaPaid", 1),
		events.RegisterJSON[SagaTimedOut](pc, "SagaTimedOut", 1),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	settlements, err := events.NewRunner(store, settlementDecider, sc, events.RunnerConfig[settlement]{})
	if err != nil {
		return nil, err
	}
	pm, err := events.NewProcessManager(store, events.ProcessManagerConfig[sagaState, sagaInput, any, settlementCmd]{
		Name: "payment", Correlate: func(in sagaInput) string { return in.Order },
		Handle: sagaHandle, Evolve: sagaEvolve, Codec: pc, Target: settlements,
	})
	if err != nil {
		return nil, err
	}
	p := &payment{store: store, pm: pm, settlements: settlements, schema: schema}
	fire, err := pm.TimerFire(func(t events.Timer) (sagaInput, error) {
		return sagaInput{Kind: "PaymentTimeout", Order: t.CorrelationID}, nil
	}, events.DispatchPolicy{})
	if err != nil {
		return nil, err
	}
	for range 2 {
		w, err := events.NewTimerWorker(store, pool, events.TimerWorkerConfig{Fire: fire, PollInterval: 100 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		p.workers = append(p.workers, w)
	}
	return p, nil
}

// inboxHandler starts the saga of each order placed, inside the inbox transaction.
func (p *payment) inboxHandler() (func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error, error) {
	return p.pm.InboxHandler(func(ev envelope.Event) (sagaInput, error) {
		var o OrderPlacedV1
		if err := json.Unmarshal(ev.Payload, &o); err != nil {
			return sagaInput{}, err
		}
		return sagaInput{Kind: "OrderPlaced", Order: o.OrderID, Amount: o.Amount, At: ev.OccurredAt}, nil
	}, events.DispatchPolicy{OnPoison: events.InputDeadLetter})
}

// pays reports whether the payments context captures order's payment: two orders in three.
func pays(order string) bool {
	n, err := strconv.Atoi(strings.TrimLeft(order, "o"))
	return err == nil && n%3 != 0
}

// capture is the payments context: PaymentCaptured for the orders that pay, each with a
// message id of its own (a redelivery would be recognised).
func (p *payment) capture(ctx context.Context, pool *pgxpool.Pool, order string) error {
	id := events.TimerID("payments", order, "PaymentCaptured") // any deterministic id of the message
	res, err := p.pm.Dispatch(ctx, pool, id, sagaInput{Kind: "PaymentCaptured", Order: order})
	if err == nil {
		err = res.Err()
	}
	return err
}

// live counts the timers not yet fired, cancelled or dead.
func (p *payment) live(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+p.schema+`.keiro_timers WHERE status IN ('scheduled', 'firing')`).Scan(&n)
	return n, err
}

// checks reads every saga and settlement back: one terminal state each, two events each.
func (p *payment) checks(ctx context.Context, pool *pgxpool.Pool, orders []string) ([]Check, error) {
	var paid, timedOut, both, open, wrong int
	for _, o := range orders {
		s, _, err := p.pm.Load(ctx, pool, o)
		if err != nil {
			return nil, err
		}
		st, version, err := p.settlements.Load(ctx, pool, events.StreamName("settlement", o))
		if err != nil {
			return nil, err
		}
		switch {
		case s.Paid && s.TimedOut:
			both++
		case s.Paid:
			paid++
		case s.TimedOut:
			timedOut++
		default:
			open++
		}
		want := map[bool]string{true: "captured", false: "void"}[s.Paid]
		if version != 2 || st.Status != want {
			wrong++
		}
	}
	var fired int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+p.schema+`.keiro_timers WHERE status = 'fired'`).Scan(&fired); err != nil {
		return nil, err
	}
	n := len(orders)
	return []Check{
		{Name: "sagas completed (paid)", Value: fmt.Sprint(paid), Informational: true, OK: true},
		{Name: "sagas timed out (settlement voided)", Value: fmt.Sprint(timedOut), Informational: true, OK: true},
		{Name: "sagas in exactly one terminal state", Value: fmt.Sprintf("%d of %d", paid+timedOut, n), OK: paid+timedOut == n && both == 0 && open == 0},
		{Name: "saga effects applied once", Value: fmt.Sprintf("%d settlements off", wrong), OK: wrong == 0},
		{Name: "payment timers fired", Value: fmt.Sprint(fired), OK: fired == int64(n)},
	}, nil
}
