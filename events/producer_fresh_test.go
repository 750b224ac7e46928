package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestProducer_FreshMessageIDsWithTheConfiguredTypeIDPrefix is keiro's "Keiro.Outbox": "mints
// message ids with the configured TypeID prefix". FreshEvent stamps the producer's source and a
// TypeID under its prefix, keeps the event's routing, gives a new id on every call, and the
// event enqueues as it is.
func TestProducer_FreshMessageIDsWithTheConfiguredTypeIDPrefix(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	p, err := events.NewProducer(newStore(t, db), db.Pool, events.ProducerConfig{Name: "p", Source: "ordering", MessageIDPrefix: "msg",
		Outbox: ob, Map: orderMapper("1")})
	require.NoError(t, err)
	draft := envelope.Event{Destination: "billing.orders.v1", EventType: "OrderPlaced", SchemaVersion: 1,
		ContentType: "application/json", Payload: json.RawMessage(`{"order":"o-1"}`), OccurredAt: time.Now()}

	minted := p.FreshEvent(draft)
	require.Equal(t, "ordering", minted.Source)
	require.Equal(t, "billing.orders.v1", minted.Destination)
	prefix, id, err := envelope.ParseTypeID(minted.MessageID)
	require.NoError(t, err)
	require.Equal(t, "msg", prefix)
	require.Equal(t, byte(7), id[6]>>4, "a UUIDv7")
	require.Empty(t, draft.MessageID, "the draft is not changed")

	again := p.FreshEvent(draft)
	require.NotEqual(t, minted.MessageID, again.MessageID)
	require.Less(t, minted.MessageID, again.MessageID)

	require.NoError(t, minted.Validate())
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := ob.EnqueueTx(ctx, tx, minted)
		return err
	}))
	var stored string
	require.NoError(t, db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT message_id FROM %s.keiro_outbox`, db.Schema)).Scan(&stored))
	require.Equal(t, minted.MessageID, stored)
}
