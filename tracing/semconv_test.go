package tracing_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/keiro-go/keiro/tracing"
)

// TestTelemetry_AttributeKeysMatchTheSpec is keiro's "Keiro.Telemetry": "re-exports
// AttributeKeys whose textual payload matches the spec name". Each key is compared with the
// name written out by hand, as keiro's test does.
func TestTelemetry_AttributeKeysMatchTheSpec(t *testing.T) {
	t.Parallel()
	for key, want := range map[attribute.Key]string{
		tracing.MessagingOperationTypeKey:          "messaging.operation.type",
		tracing.MessagingOperationNameKey:          "messaging.operation.name",
		tracing.MessagingDestinationPartitionIDKey: "messaging.destination.partition.id",
		tracing.MessagingConsumerGroupNameKey:      "messaging.consumer.group.name",
		tracing.MessagingClientIDKey:               "messaging.client.id",
		tracing.MessagingKafkaOffsetKey:            "messaging.kafka.offset",
		tracing.DBSystemNameKey:                    "db.system.name",
		tracing.DBNamespaceKey:                     "db.namespace",
		tracing.DBCollectionNameKey:                "db.collection.name",
		tracing.DBOperationNameKey:                 "db.operation.name",
		tracing.StreamNameKey:                      "keiro.stream.name",
		tracing.RetryAttemptKey:                    "keiro.retry.attempt",
		tracing.EventsAppendedKey:                  "keiro.events.appended",
		tracing.ReplayDivergenceKey:                "keiro.replay.divergence",
	} {
		require.Equal(t, want, string(key))
	}
}
