package tracing

import (
	"go.opentelemetry.io/otel/attribute"
)

// Span attribute keys of the OpenTelemetry messaging semantic conventions (Kafka), as keiro's
// send and process spans use them. The text of each key follows the current (Development)
// conventions, not the legacy names franz-go's kotel still emits.
const (
	// MessagingSystemKey is "messaging.system"; keiro always sets it to [MessagingSystemKafka].
	MessagingSystemKey = attribute.Key("messaging.system")
	// MessagingOperationTypeKey is "messaging.operation.type": [OperationSend] or
	// [OperationProcess].
	MessagingOperationTypeKey = attribute.Key("messaging.operation.type")
	// MessagingOperationNameKey is "messaging.operation.name": [OperationSend] or
	// [OperationProcess].
	MessagingOperationNameKey = attribute.Key("messaging.operation.name")
	// MessagingDestinationNameKey is "messaging.destination.name": the Kafka topic.
	MessagingDestinationNameKey = attribute.Key("messaging.destination.name")
	// MessagingDestinationPartitionIDKey is "messaging.destination.partition.id": the partition
	// number as a decimal string (use [PartitionID]).
	MessagingDestinationPartitionIDKey = attribute.Key("messaging.destination.partition.id")
	// MessagingKafkaOffsetKey is "messaging.kafka.offset": the record offset (int).
	MessagingKafkaOffsetKey = attribute.Key("messaging.kafka.offset")
	// MessagingMessageIDKey is "messaging.message.id": the envelope's message id.
	MessagingMessageIDKey = attribute.Key("messaging.message.id")
	// MessagingKafkaMessageKeyKey is "messaging.kafka.message.key": the record key; set only
	// when the record has a key.
	MessagingKafkaMessageKeyKey = attribute.Key("messaging.kafka.message.key")
	// MessagingKafkaMessageTombstoneKey is "messaging.kafka.message.tombstone"; set only when true.
	MessagingKafkaMessageTombstoneKey = attribute.Key("messaging.kafka.message.tombstone")
	// MessagingConsumerGroupNameKey is "messaging.consumer.group.name": the consumer group.
	MessagingConsumerGroupNameKey = attribute.Key("messaging.consumer.group.name")
	// MessagingClientIDKey is "messaging.client.id": the Kafka client id.
	MessagingClientIDKey = attribute.Key("messaging.client.id")
	// MessagingBatchMessageCountKey is "messaging.batch.message_count" for batch operations.
	MessagingBatchMessageCountKey = attribute.Key("messaging.batch.message_count")
	// ErrorTypeKey is "error.type": a low-cardinality failure class (a Kafka error code name
	// such as "NOT_ENOUGH_REPLICAS", or a Go error type).
	ErrorTypeKey = attribute.Key("error.type")

	// DBSystemNameKey is "db.system.name"; keiro sets it to "postgresql".
	DBSystemNameKey = attribute.Key("db.system.name")
	// DBNamespaceKey is "db.namespace": the database (and schema) name.
	DBNamespaceKey = attribute.Key("db.namespace")
	// DBCollectionNameKey is "db.collection.name": the table name.
	DBCollectionNameKey = attribute.Key("db.collection.name")
	// DBOperationNameKey is "db.operation.name": the SQL operation.
	DBOperationNameKey = attribute.Key("db.operation.name")
)

// keiro's own span attribute keys.
const (
	// OutboxAttemptKey is "keiro.outbox.attempt" on the send span: the row's attempt number for
	// this publish (1 for the first try).
	OutboxAttemptKey = attribute.Key("keiro.outbox.attempt")
	// OutboxRejectionCodeKey is "keiro.outbox.rejection_code" on the send span of a record
	// rejected before it was sent: the row's rejection code.
	OutboxRejectionCodeKey = attribute.Key("keiro.outbox.rejection_code")
	// OutboxSlotKey is "keiro.outbox.slot" on log mode's slot gauges: the replication slot's
	// name.
	OutboxSlotKey = attribute.Key("keiro.outbox.slot")
	// OutboxBatchSizeKey is "keiro.outbox.batch.size": rows in a claimed batch (keiro's key).
	OutboxBatchSizeKey = attribute.Key("keiro.outbox.batch.size")
	// InboxOutcomeKey is "keiro.inbox.outcome" on the process span: one of
	// [InboxOutcomeProcessed], [InboxOutcomeDuplicate], [InboxOutcomeFailed],
	// [InboxOutcomePoisoned], [InboxOutcomeDeferred].
	InboxOutcomeKey = attribute.Key("keiro.inbox.outcome")
	// StreamNameKey is "keiro.stream.name" on command spans.
	StreamNameKey = attribute.Key("keiro.stream.name")
	// RetryAttemptKey is "keiro.retry.attempt": the final attempt number of a command.
	RetryAttemptKey = attribute.Key("keiro.retry.attempt")
	// EventsAppendedKey is "keiro.events.appended": events a command appended.
	EventsAppendedKey = attribute.Key("keiro.events.appended")
	// ReplayDivergenceKey is "keiro.replay.divergence" on a command span whose appended events
	// did not replay to the decided state: "event_index=<i>;reason=<why>".
	ReplayDivergenceKey = attribute.Key("keiro.replay.divergence")
)

// Metric attribute keys. Metric attributes are bounded: never a message id or a record key.
// Where the messaging semantic conventions define a key, keiro's metrics use it, so the
// Prometheus labels are the same on keiro's and other clients' series (messaging.destination.name
// becomes the label messaging_destination_name).
const (
	// SourceKey is "source": the producing bounded context (keiro.outbox.enqueued).
	SourceKey = attribute.Key("source")
	// OutcomeKey is "outcome": [OutcomeInserted], [OutcomeDuplicate], [OutcomeConflict] or
	// [OutcomeEmitted] (keiro.outbox.enqueued).
	OutcomeKey = attribute.Key("outcome")
	// DestinationKey is "messaging.destination.name": the topic an outbox row targets or a
	// consumer reads.
	DestinationKey = MessagingDestinationNameKey
	// ConsumerKey is "keiro.consumer.name": the inbox consumer name (the dedupe namespace,
	// which defaults to the consumer group).
	ConsumerKey = attribute.Key("keiro.consumer.name")
	// GroupKey is "messaging.consumer.group.name": the Kafka consumer group.
	GroupKey = MessagingConsumerGroupNameKey
	// TopicKey is the same key as [DestinationKey], kept for the consumer side's readers.
	TopicKey = MessagingDestinationNameKey
	// PartitionKey is "messaging.destination.partition.id": the partition number as a decimal
	// string (keiro.consumer.lag).
	PartitionKey = MessagingDestinationPartitionIDKey
)

// Attribute values.
const (
	// MessagingSystemKafka is the value of [MessagingSystemKey].
	MessagingSystemKafka = "kafka"
	// OperationSend is the operation type and name of the relay's producer span.
	OperationSend = "send"
	// OperationProcess is the operation type and name of the consumer's span.
	OperationProcess = "process"
	// OperationPoll is the operation name of messaging.client.consumed.messages: the consumer
	// polls its records from Kafka.
	OperationPoll = "poll"

	// OutcomeInserted: the enqueue wrote a new outbox row.
	OutcomeInserted = "inserted"
	// OutcomeDuplicate: the enqueue found an identical row (same identity, same content).
	OutcomeDuplicate = "duplicate"
	// OutcomeConflict: the enqueue found a row with the same identity but different content.
	OutcomeConflict = "conflict"
	// OutcomeEmitted: the event was written as a logical decoding message (outbox's EmitTx),
	// with no row and no duplicate check.
	OutcomeEmitted = "emitted"

	// InboxOutcomeProcessed: the handler ran and its effects committed with the inbox row.
	InboxOutcomeProcessed = "processed"
	// InboxOutcomeDuplicate: the message was already recorded; the handler did not run.
	InboxOutcomeDuplicate = "duplicate"
	// InboxOutcomeFailed: the handler failed; the message will be retried.
	InboxOutcomeFailed = "failed"
	// InboxOutcomePoisoned: the handler failed permanently or past the attempt ceiling; the
	// message went to the dead-letter topic.
	InboxOutcomePoisoned = "poisoned"
	// InboxOutcomeDeferred: the handler failed on contention or an outage of its target; the
	// message is retried without using an attempt.
	InboxOutcomeDeferred = "deferred"
)
