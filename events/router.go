package events

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
)

// RouterConfig defines a Router.
type RouterConfig[I, C any] struct {
	// Name identifies the router; it is part of every routed command's id, so renaming a
	// router makes redeliveries of old inputs dispatch again. Required.
	Name string
	// Key returns the routing key of an input (for example the order id); it is part of the
	// command ids. Required.
	Key func(input I) string
	// Resolve returns the commands an input becomes, in any order. It may read a read model:
	// a later delivery of the same input may resolve to other targets, and each target is
	// dispatched at most once per input whatever the order. Required.
	Resolve func(ctx context.Context, input I) ([]Command[C], error)
	// Target runs the commands (a *Runner). Required.
	Target Target[C]
}

// Router turns an input (an integration event from the inbox, or a private event from a
// subscription) into commands on target streams, without state of its own. Each command runs
// through the target's command runner in its own transaction, with the id of its first event
// derived from (router, key, source event id, target stream, occurrence) by
// [RouterCommandID], so a redelivered input dispatches each target at most once, even when
// Resolve returns the targets in another order; a target Resolve adds on a later delivery is
// dispatched then, and a target it drops keeps its earlier dispatch. Fan-out is idempotent,
// not atomic: a failure leaves the other targets' commands committed, and redelivering the
// input completes the rest. A Router is safe for concurrent use.
type Router[I, C any] struct {
	store *Store
	cfg   RouterConfig[I, C]
}

// NewRouter returns a Router, reporting every configuration problem at once.
func NewRouter[I, C any](store *Store, cfg RouterConfig[I, C]) (*Router[I, C], error) {
	var errs []error
	if store == nil {
		errs = append(errs, errors.New("store is nil"))
	}
	if strings.TrimSpace(cfg.Name) == "" {
		errs = append(errs, errors.New("Name: required"))
	}
	if cfg.Key == nil {
		errs = append(errs, errors.New("Key: required"))
	}
	if cfg.Resolve == nil {
		errs = append(errs, errors.New("Resolve: required"))
	}
	if cfg.Target == nil {
		errs = append(errs, errors.New("Target: required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new router: %w", err)
	}
	return &Router[I, C]{store: store, cfg: cfg}, nil
}

// Name returns the router's name.
func (r *Router[I, C]) Name() string { return r.cfg.Name }

// RouterResult reports one routed input.
type RouterResult struct {
	// Key is the input's routing key.
	Key string
	// Commands reports each resolved command, in Resolve's order.
	Commands []CommandResult
}

// Err returns the failed commands' errors joined, or nil when none failed.
func (r RouterResult) Err() error {
	var errs []error
	for _, c := range r.Commands {
		if c.Outcome == CommandFailed {
			errs = append(errs, c.Err)
		}
	}
	return errors.Join(errs...)
}

// Dispatch resolves input and dispatches each command, in order, on db (a pool, or a
// transaction whose savepoints then hold each command). source is the id of the event or
// message the input came from (RecordedEvent.ID, InboxSourceID); it must be the same on every
// delivery. Dispatch returns an error only when Resolve fails or source is the zero UUID; a
// command's failure is reported in its CommandResult (RouterResult.Err joins them) and does
// not stop the others. Dispatch applies no DispatchPolicy: EventHandler and InboxHandler do.
func (r *Router[I, C]) Dispatch(ctx context.Context, db keiro.DB, source envelope.UUID, input I) (RouterResult, error) {
	key, res, err := r.dispatch(ctx, db, DispatchSource{EventID: source}, input)
	out := RouterResult{Key: key, Commands: make([]CommandResult, len(res))}
	for i, e := range res {
		out.Commands[i] = e.result
	}
	return out, err
}

func (r *Router[I, C]) dispatch(ctx context.Context, db keiro.DB, src DispatchSource, input I) (string, []emitted, error) {
	if src.EventID.IsZero() {
		return "", nil, fmt.Errorf("router %s: the source event id is the zero UUID; pass the id of the event or message the input came from", r.cfg.Name)
	}
	key := r.cfg.Key(input)
	cmds, err := r.cfg.Resolve(ctx, input)
	if err != nil {
		return key, nil, fmt.Errorf("router %s: resolve %s: %w", r.cfg.Name, key, err)
	}
	res := make([]emitted, 0, len(cmds))
	seen := make(map[string]int, len(cmds)) // target stream → occurrences so far
	md := causedBy(src.EventID)
	for i, cmd := range cmds {
		occurrence := seen[cmd.Stream]
		seen[cmd.Stream]++
		id := RouterCommandID(r.cfg.Name, key, src.EventID, cmd.Stream, occurrence)
		res = append(res, emitted{index: i, result: dispatchCommand(ctx, r.store, db, r.cfg.Target, cmd, id, md)})
	}
	return key, res, nil
}

// EventHandler returns a subscription Handler that decodes each event into an input and
// dispatches it in the subscription's transaction, so the commands commit with the
// checkpoint: a crash replays the event, and the redelivery dispatches only what did not
// commit. Failures follow p (see DispatchPolicy): a halt stops the subscription's Run on the
// event; a transient failure is delivered again under the subscription's RetryPolicy. The
// source id is the event's id.
func (r *Router[I, C]) EventHandler(decode func(RecordedEvent) (I, error), p DispatchPolicy) (Handler, error) {
	if decode == nil {
		return nil, fmt.Errorf("router %s: event handler: decode is nil", r.cfg.Name)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("router %s: event handler: %w", r.cfg.Name, err)
	}
	return func(ctx context.Context, tx pgx.Tx, e RecordedEvent) error {
		src := DispatchSource{EventID: e.ID, GlobalPosition: e.GlobalPosition}
		return handleInput(ctx, r.store, tx, DispatcherRouter, r.cfg.Name, src, p,
			func() (I, error) { return decode(e) }, r.dispatch)
	}, nil
}

// InboxHandler returns a handler for the inbox (its type is inbox.Handler's: pass it to
// inbox.Store.Process or inbox.NewConsumer) that decodes each integration event into an input
// and dispatches it inside the inbox transaction, so the inbox row and the commands commit
// together or not at all; the consumer needs to know nothing about it. Failures follow p (see
// DispatchPolicy): a transient failure or a halt is marked inbox.Outage, which the consumer
// retries in place without counting attempts; InputDeadLetter poisons the message at once.
// The source id is InboxSourceID(ev).
func (r *Router[I, C]) InboxHandler(decode func(envelope.Event) (I, error), p DispatchPolicy) (func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error, error) {
	if decode == nil {
		return nil, fmt.Errorf("router %s: inbox handler: decode is nil", r.cfg.Name)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("router %s: inbox handler: %w", r.cfg.Name, err)
	}
	return func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		src := DispatchSource{EventID: InboxSourceID(ev)}
		return forInbox(handleInput(ctx, r.store, tx, DispatcherRouter, r.cfg.Name, src, p,
			func() (I, error) { return decode(ev) }, r.dispatch))
	}, nil
}
