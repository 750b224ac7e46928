package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

func TestIdempotencyKeyFollowsDedupePolicy(t *testing.T) {
	ctx := context.Background()
	ev := orderEvent("m-1", 1)
	id := envelope.NewUUIDv7()
	ev.SourceEventID = &id

	require.Equal(t, "m-1", idempotencyDedupeKey(dedupePolicy("message-id"), nil)(ctx, ev))
	require.Equal(t, id.String(), idempotencyDedupeKey(dedupePolicy("source-event"), nil)(ctx, ev))
	require.Equal(t, "m-1", idempotencyDedupeKey(dedupePolicy("kafka-delivery"), nil)(ctx, ev),
		"the Kafka coordinates are not visible to handlers: the message id stands in")

	pos := int64(42)
	ev.SourceEventID, ev.SourceGlobalPosition = nil, &pos
	require.Equal(t, "42", idempotencyDedupeKey(dedupePolicy("source-event"), nil)(ctx, ev))
	ev.SourceGlobalPosition = nil
	require.Equal(t, "m-1", idempotencyDedupeKey(dedupePolicy("source-event"), nil)(ctx, ev),
		"an unsatisfiable policy never reaches the handler; the message id is the fallback")
}

func TestPolicyAndPersistenceNames(t *testing.T) {
	require.Equal(t, inbox.DedupeMessageID.String(), dedupePolicy("message-id").String())
	require.Equal(t, inbox.DedupeSourceEventIdentity.String(), dedupePolicy("source-event").String())
	require.Equal(t, inbox.DedupeKafkaDelivery.String(), dedupePolicy("kafka-delivery").String())
	require.Equal(t, inbox.FullEnvelope, persistence("full"))
	require.Equal(t, inbox.DedupeOnly, persistence("dedupe-only"))
}

func TestBuildHandlerModes(t *testing.T) {
	for _, f := range []handlerFlags{
		{Handler: "http", HTTPURL: "https://svc.example/events", HTTPTimeout: DefaultHTTPTimeout, HTTPHeader: []cli.Secret{"Authorization: Bearer x"}},
		{Handler: "sql", SQLFunction: "billing.apply_event"},
		{Handler: "sql", SQLFunction: "apply", SchemaRegistryURL: "http://registry.example:8081"},
	} {
		b, err := buildHandler(&f, "billing", inbox.DedupeMessageID, nil)
		require.NoError(t, err, f.Handler)
		require.NotNil(t, b.handle)
		b.close()
	}
	_, err := buildHandler(&handlerFlags{Handler: "grpc"}, "billing", inbox.DedupeMessageID, nil)
	require.ErrorContains(t, err, "unknown handler mode")
	_, err = buildHandler(&handlerFlags{Handler: "sql", SQLFunction: "a;b"}, "billing", inbox.DedupeMessageID, nil)
	require.Error(t, err)
}
