package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// placeOrders appends one "Placed" event per group to order streams and returns their ids.
func placeOrders(t *testing.T, db *testenv.DB, s *events.Store, groups ...string) []envelope.UUID {
	t.Helper()
	var ids []envelope.UUID
	for i, g := range groups {
		data, err := json.Marshal(groupInput{Group: g})
		require.NoError(t, err)
		res, err := appendTx(t, db, s, events.StreamName("order", string(rune('a'+i))), events.NoStream,
			events.EventData{Type: "Placed", SchemaVersion: 1, Data: data})
		require.NoError(t, err)
		ids = append(ids, res.Events[0].ID)
	}
	return ids
}

func decodeGroup(e events.RecordedEvent) (groupInput, error) {
	var in groupInput
	err := json.Unmarshal(e.Data, &in)
	return in, err
}

// TestRouterFromSubscription: a router run by a subscription dispatches each event's commands
// in the checkpoint's transaction; a second subscription over the same events (a replay)
// dispatches nothing twice.
func TestRouterFromSubscription(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _, r := newGroupRouter(t, db)
	ctx := context.Background()
	setMembers(t, db, "g1", "counter-a", "counter-b")
	setMembers(t, db, "g2", "counter-c")
	ids := placeOrders(t, db, s, "g1", "g2")
	h, err := r.EventHandler(decodeGroup, events.DispatchPolicy{})
	require.NoError(t, err)

	for _, name := range []string{"billing", "billing-replay"} {
		p := new(testenv.Progress)
		sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: name, Category: "order", AfterCommit: p.Set}, h)
		require.NoError(t, err)
		stop, errc := runSub(t, sub)
		p.Wait(t, head(t, s, db), time.Minute, errc)
		stop()
		for _, stream := range []string{"counter-a", "counter-b", "counter-c"} {
			require.Equal(t, 1, streamLen(t, s, db, stream), "%s after %s", stream, name)
		}
	}
	var got events.RecordedEvent
	for e, err := range s.ReadStream(ctx, db.Pool, "counter-c", events.Forward, 0) {
		require.NoError(t, err)
		got = e
	}
	require.Equal(t, events.RouterCommandID("fanout", "g2", ids[1], "counter-c", 0), got.ID)
	require.Equal(t, ids[1], *got.Metadata.CausationID)
}

// TestRouterFromSubscriptionHalts: a rejected command under the default policy stops the
// subscription on the event, with nothing of it committed and the checkpoint before it.
func TestRouterFromSubscriptionHalts(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, r := newListRouter(t, db, nil)
	ctx := context.Background()
	placeOrders(t, db, s, "g1", "g2")
	h, err := r.EventHandler(func(e events.RecordedEvent) (routedInput, error) {
		in, err := decodeGroup(e)
		out := routedInput{Group: in.Group, Targets: []events.Command[counterCmd]{accepting}}
		if in.Group == "g2" {
			out.Targets = append(out.Targets, rejecting)
		}
		return out, err
	}, events.DispatchPolicy{})
	require.NoError(t, err)
	sub, err := events.NewSubscription(s, db.Pool, events.SubscriptionConfig{Name: "strict", Category: "order"}, h)
	require.NoError(t, err)
	err = sub.Run(ctx)
	require.ErrorIs(t, err, events.ErrDispatchHalted)
	require.ErrorContains(t, err, "negative amount")
	require.Equal(t, 1, streamLen(t, s, db, "counter-ok")) // g1's command only
	pos, err := sub.Position(ctx)
	require.NoError(t, err)
	var first events.RecordedEvent
	for e, err := range s.ReadStream(ctx, db.Pool, "order-a", events.Forward, 0) {
		require.NoError(t, err)
		first = e
	}
	require.Equal(t, first.GlobalPosition, pos) // g1's event; g2's is delivered again by the next Run
}

func integrationEvent(id, group string) envelope.Event {
	payload, _ := json.Marshal(groupInput{Group: group})
	return envelope.Event{MessageID: id, Source: "ordering", Destination: "ordering.orders.v1", EventType: "OrderPlaced",
		SchemaVersion: 1, ContentType: "application/json", Payload: payload, OccurredAt: time.Now().UTC()}
}

func decodeIntegration(ev envelope.Event) (groupInput, error) {
	var in groupInput
	err := json.Unmarshal(ev.Payload, &in)
	return in, err
}

// TestRouterFromInbox: a router run by the inbox dispatches inside the inbox transaction: the
// inbox row and the commands commit together, a redelivery is the inbox's duplicate, a
// failure after the dispatch rolls the commands back, and a halt defers the message without
// using an attempt.
func TestRouterFromInbox(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _, r := newGroupRouter(t, db)
	ctx := context.Background()
	setMembers(t, db, "g1", "counter-a", "counter-b")
	st, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "billing"})
	require.NoError(t, err)
	h, err := r.InboxHandler(decodeIntegration, events.DispatchPolicy{OnPoison: events.InputDeadLetter})
	require.NoError(t, err)

	ev := integrationEvent("order-placed-1", "g1")
	res, err := st.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h)
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome, "%v", res.Err)
	require.Equal(t, 1, streamLen(t, s, db, "counter-a"))
	require.Equal(t, 1, streamLen(t, s, db, "counter-b"))
	var got events.RecordedEvent
	for e, err := range s.ReadStream(ctx, db.Pool, "counter-a", events.Forward, 0) {
		require.NoError(t, err)
		got = e
	}
	src := events.InboxSourceID(ev)
	require.Equal(t, events.RouterCommandID("fanout", "g1", src, "counter-a", 0), got.ID)
	require.Equal(t, src, *got.Metadata.CausationID)
	res, err = st.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h)
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, res.Outcome)

	// A step after the dispatch fails: the inbox transaction rolls back with the commands.
	later := errors.New("the handler's next step failed")
	ev2 := integrationEvent("order-placed-2", "g1")
	res, err = st.Process(ctx, db.Pool, inbox.Delivery{Event: ev2}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if err := h(ctx, tx, ev); err != nil {
			return err
		}
		return later
	})
	require.NoError(t, err)
	require.Equal(t, inbox.HandlerFailed, res.Outcome)
	require.Equal(t, 1, streamLen(t, s, db, "counter-a"))
	res, err = st.Process(ctx, db.Pool, inbox.Delivery{Event: ev2}, h)
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome, "%v", res.Err)
	require.Equal(t, 2, streamLen(t, s, db, "counter-a"))

	// An undecodable payload under InputDeadLetter is poisoned at once.
	bad := integrationEvent("order-placed-3", "g1")
	bad.Payload = []byte("not json")
	res, err = st.Process(ctx, db.Pool, inbox.Delivery{Event: bad}, h)
	require.NoError(t, err)
	require.Equal(t, inbox.Poisoned, res.Outcome)
}

func TestRouterFromInboxHaltDefers(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, r := newListRouter(t, db, nil)
	ctx := context.Background()
	st, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "billing", MaxAttempts: 1})
	require.NoError(t, err)
	targets := []events.Command[counterCmd]{accepting, rejecting}
	h, err := r.InboxHandler(func(ev envelope.Event) (routedInput, error) {
		in, err := decodeIntegration(ev)
		return routedInput{Group: in.Group, Targets: targets}, err
	}, events.DispatchPolicy{})
	require.NoError(t, err)
	ev := integrationEvent("018f0f18-17aa-7000-8000-0000000000bb", "g1")
	require.Equal(t, mustParseUUID(ev.MessageID), events.InboxSourceID(ev))
	for range 2 { // under MaxAttempts 1, a counted attempt would poison the message
		res, err := st.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h)
		require.NoError(t, err)
		require.Equal(t, inbox.Deferred, res.Outcome)
		require.ErrorIs(t, res.Err, events.ErrDispatchHalted)
		require.Equal(t, 0, streamLen(t, s, db, "counter-ok"))
	}
	targets = targets[:1] // the operator fixed the cause
	res, err := st.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h)
	require.NoError(t, err)
	require.Equal(t, inbox.Processed, res.Outcome, "%v", res.Err)
	require.Equal(t, 1, streamLen(t, s, db, "counter-ok"))
}
