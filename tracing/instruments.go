package tracing

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the OpenTelemetry instrumentation scope of every keiro meter and tracer.
const ScopeName = "keiro"

// Meter returns the "keiro" meter of mp, or of the global MeterProvider when mp is nil. With no
// SDK installed the global provider is a no-op, so instruments cost next to nothing.
func Meter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(ScopeName)
}

// Tracer returns the "keiro" tracer of tp, or of the global TracerProvider when tp is nil.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(ScopeName)
}

// Kind is the kind of a metric instrument.
type Kind int

// Instrument kinds.
const (
	// Counter is a monotonic sum (Int64Counter); Prometheus exposes it with a _total suffix.
	Counter Kind = iota + 1
	// Gauge is a last value (Int64Gauge, Float64Gauge or an observable gauge).
	Gauge
	// Histogram is an explicit-bucket histogram (Float64Histogram); Prometheus exposes
	// _bucket, _sum and _count series.
	Histogram
)

// String returns "counter", "gauge" or "histogram".
func (k Kind) String() string {
	switch k {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	case Histogram:
		return "histogram"
	}
	return "unknown"
}

// Metric names of the OpenTelemetry messaging semantic conventions that keiro records (Kafka
// client side). Each carries messaging.system=kafka and messaging.operation.name; error.type
// marks the failures.
const (
	// MetricClientSentMessages names a counter in {message}: records the relay produced,
	// acknowledged or failed (error.type); attributes messaging.system,
	// messaging.operation.name=send, messaging.destination.name, error.type.
	MetricClientSentMessages = "messaging.client.sent.messages"
	// MetricClientOperationDuration names a histogram in s: from the relay's produce call to the
	// broker's answer; same attributes as [MetricClientSentMessages].
	MetricClientOperationDuration = "messaging.client.operation.duration"
	// MetricClientConsumedMessages names a counter in {message}: records the consumer polled
	// and handed to the inbox (duplicates included); attributes messaging.system,
	// messaging.operation.name=poll, messaging.destination.name, messaging.consumer.group.name.
	MetricClientConsumedMessages = "messaging.client.consumed.messages"
	// MetricProcessDuration names a histogram in s: one message's inbox transaction, handler
	// included; attributes messaging.system, messaging.operation.name=process,
	// messaging.destination.name, messaging.consumer.group.name, error.type (when the message
	// failed).
	MetricProcessDuration = "messaging.process.duration"
)

// Metric names of the product's vocabulary. Prometheus sees them translated: dots become
// underscores, unit "s" adds _seconds, counters add _total, curly-brace units add nothing
// (keiro.outbox.published → keiro_outbox_published_total).
const (
	// MetricOutboxEnqueued names a counter in {event}; attributes source, outcome.
	MetricOutboxEnqueued = "keiro.outbox.enqueued"
	// MetricOutboxPublished names a counter in {event}; attribute messaging.destination.name.
	MetricOutboxPublished = "keiro.outbox.published"
	// MetricOutboxRetried names a counter in {event}; attribute messaging.destination.name.
	MetricOutboxRetried = "keiro.outbox.retried"
	// MetricOutboxDeadlettered names a counter in {event}; attribute messaging.destination.name.
	MetricOutboxDeadlettered = "keiro.outbox.deadlettered"
	// MetricOutboxRejected names a counter in {event}; attribute messaging.destination.name.
	MetricOutboxRejected = "keiro.outbox.rejected"
	// MetricOutboxReclaimed names a counter in {event}.
	MetricOutboxReclaimed = "keiro.outbox.reclaimed"
	// MetricOutboxOrderBroken names a counter in {event}: rows Kafka acknowledged after an
	// earlier row of their key failed in the same flush. It should stay 0; alert on it.
	// Attribute messaging.destination.name.
	MetricOutboxOrderBroken = "keiro.outbox.order_broken"
	// MetricOutboxBacklog names a gauge in {event}: pending+failed+publishing rows, per
	// messaging.destination.name.
	MetricOutboxBacklog = "keiro.outbox.backlog"
	// MetricOutboxOldestPending names a gauge in s: age of the oldest unpublished row, per
	// messaging.destination.name.
	MetricOutboxOldestPending = "keiro.outbox.oldest_pending.age"
	// MetricOutboxDead names a gauge in {event}: dead+rejected rows, per
	// messaging.destination.name.
	MetricOutboxDead = "keiro.outbox.dead"
	// MetricOutboxPublishLatency names a histogram in s: row created_at to broker ack.
	MetricOutboxPublishLatency = "keiro.outbox.publish.latency"
	// MetricOutboxBatchSize names a histogram in {event}: rows per claimed batch.
	MetricOutboxBatchSize = "keiro.outbox.batch.size"
	// MetricOutboxTransactions names a counter in {transaction}: the Kafka transactions of an
	// exactly-once relay, by outcome (committed, aborted).
	MetricOutboxTransactions = "keiro.outbox.transactions"
	// MetricOutboxFenced names a counter in {fence}: the times an exactly-once relay found its
	// transactional id taken over by a newer relay (it was a zombie: it published nothing
	// more and started again).
	MetricOutboxFenced = "keiro.outbox.fenced"

	// MetricInboxProcessed names a counter in {message}; attributes keiro.consumer.name,
	// messaging.destination.name, messaging.consumer.group.name.
	MetricInboxProcessed = "keiro.inbox.processed"
	// MetricInboxDuplicates names a counter in {message}; attributes keiro.consumer.name,
	// messaging.destination.name, messaging.consumer.group.name.
	MetricInboxDuplicates = "keiro.inbox.duplicates"
	// MetricInboxFailed names a counter in {message}; attributes keiro.consumer.name,
	// messaging.destination.name, messaging.consumer.group.name.
	MetricInboxFailed = "keiro.inbox.failed"
	// MetricInboxPoisoned names a counter in {message}; attributes keiro.consumer.name,
	// messaging.destination.name, messaging.consumer.group.name.
	MetricInboxPoisoned = "keiro.inbox.poisoned"
	// MetricInboxDeadlettered names a counter in {message}; attributes keiro.consumer.name,
	// messaging.destination.name, messaging.consumer.group.name.
	MetricInboxDeadlettered = "keiro.inbox.deadlettered"
	// MetricInboxDeadLetterValueOmitted names a counter in {message}: dead letters Kafka could
	// not take whole (too large), sent with their value omitted; attributes keiro.consumer.name,
	// messaging.destination.name (the consumed topic), messaging.consumer.group.name.
	MetricInboxDeadLetterValueOmitted = "keiro.inbox.deadletter.value_omitted"
	// MetricInboxDeadLetterFailures names a counter in {produce}: dead-letter produces that
	// failed and will be retried (the dead-letter topic missing, not writable, or Kafka
	// unavailable); attributes keiro.consumer.name, messaging.consumer.group.name, error.type
	// (the Kafka error's name, or _OTHER).
	MetricInboxDeadLetterFailures = "keiro.inbox.deadletter.failures"
	// MetricInboxDeadLetterBlocked names a gauge in {partition}: partitions waiting on a
	// failing dead-letter produce; attributes keiro.consumer.name, messaging.consumer.group.name.
	MetricInboxDeadLetterBlocked = "keiro.inbox.deadletter.blocked"
	// MetricInboxHandlerDuration names a histogram in s: time in the handler.
	MetricInboxHandlerDuration = "keiro.inbox.handler.duration"
	// MetricInboxBacklog names a gauge in {message}: failed inbox rows; attributes
	// keiro.consumer.name, messaging.consumer.group.name.
	MetricInboxBacklog = "keiro.inbox.backlog"
	// MetricConsumerLag names a gauge in {message}, measured from Kafka (end offset minus the
	// group's committed offset) for the partitions this member owns; attributes
	// messaging.consumer.group.name, messaging.destination.name,
	// messaging.destination.partition.id.
	MetricConsumerLag = "keiro.consumer.lag"
	// MetricConsumerFetchPauses names a counter in {pause}: times a partition's fetching was
	// paused because its buffer was full while another partition needed a poll (each costs a
	// re-fetch of what the client held for it); attributes messaging.consumer.group.name,
	// messaging.destination.name, messaging.destination.partition.id.
	MetricConsumerFetchPauses = "keiro.consumer.fetch.pauses"
	// MetricConsumerCommitFailures names a counter in {commit}: offset commits Kafka refused or
	// did not answer in time (the group coordinator out, a rebalance under way), each retried
	// after the consumer's Retry backoff; attributes messaging.consumer.group.name,
	// messaging.destination.name, messaging.destination.partition.id, error.type (the Kafka
	// error's name, or _OTHER).
	MetricConsumerCommitFailures = "keiro.consumer.commit.failures"

	// MetricCommandConflicts names a counter in {conflict}: appends that met a version conflict.
	MetricCommandConflicts = "keiro.command.conflicts"
	// MetricCommandRetries names a counter in {retry}: command attempts retried after a conflict.
	MetricCommandRetries = "keiro.command.retries"
	// MetricCommandDuplicates names a counter in {append}: appends whose event ids were stored.
	MetricCommandDuplicates = "keiro.command.duplicates"
	// MetricSnapshotWriteFailures names a counter in {failure}: snapshot writes that failed.
	MetricSnapshotWriteFailures = "keiro.snapshot.write.failures"
	// MetricSnapshotEncodeFailures names a counter in {failure}: snapshot states that could not
	// be encoded.
	MetricSnapshotEncodeFailures = "keiro.snapshot.encode.failures"
	// MetricSnapshotDecodeFailures names a counter in {failure}: stored snapshots that could not
	// be decoded (the hydration replayed the whole stream).
	MetricSnapshotDecodeFailures = "keiro.snapshot.decode.failures"
	// MetricSnapshotHits names a counter in {read}: snapshot lookups that seeded a hydration.
	MetricSnapshotHits = "keiro.snapshot.read.hits"
	// MetricSnapshotMisses names a counter in {read}: snapshot lookups without a usable snapshot.
	MetricSnapshotMisses = "keiro.snapshot.read.misses"
	// MetricSnapshotApplyDivergence names a counter in {failure}: just-appended event batches
	// that did not replay, through the codec, to the state the command decided (checked where a
	// snapshot is due; none is written then).
	MetricSnapshotApplyDivergence = "keiro.snapshot.apply.divergence"
	// MetricSubscriptionDeadLettered names a counter in {event}: events a subscription recorded
	// as dead letters and moved past; attribute keiro.subscription.name.
	MetricSubscriptionDeadLettered = "keiro.subscription.deadlettered"
	// MetricSubscriptionRetried names a counter in {delivery}: deliveries repeated after a
	// handler failure; attribute keiro.subscription.name.
	MetricSubscriptionRetried = "keiro.subscription.retried"
	// MetricSubscriptionReplayed names a counter in {event}: dead letters delivered again on
	// request; attributes keiro.subscription.name and outcome (replayed, failed).
	MetricSubscriptionReplayed = "keiro.subscription.replayed"
	// MetricProjectionLag names a gauge in {event}: log head minus a subscription's checkpoint;
	// attribute keiro.subscription.name.
	MetricProjectionLag = "keiro.projection.lag"
	// MetricProjectionWaitTimeouts names a counter in {wait}: read-model consistency waits that
	// timed out before the subscription reached the target; attribute keiro.subscription.name.
	MetricProjectionWaitTimeouts = "keiro.projection.wait.timeouts"
	// MetricOutboxIdentityConflict names a counter in {event}: integration-producer enqueues
	// whose deterministic message id was stored with different content.
	MetricOutboxIdentityConflict = "keiro.outbox.identity.conflict"
	// MetricDispatchPoison names a counter in {input}: router and process manager inputs that
	// could not be decoded.
	MetricDispatchPoison = "keiro.dispatch.poison"
	// MetricDispatchFailed names a counter in {command}: routed and process manager commands
	// (and resolves) that failed.
	MetricDispatchFailed = "keiro.dispatch.failed"
	// MetricDispatchDuplicates names a counter in {command}: commands an earlier delivery had
	// already dispatched.
	MetricDispatchDuplicates = "keiro.dispatch.duplicates"
	// MetricDispatchDeadLettered names a counter in {command}: rejected commands set aside
	// (RejectedDeadLetter or RejectedSkip).
	MetricDispatchDeadLettered = "keiro.dispatch.deadlettered"
	// MetricTimerBacklog names a gauge in {timer}: scheduled timers that are due.
	MetricTimerBacklog = "keiro.timer.backlog"
	// MetricTimerStuck names a gauge in {timer}: firing timers.
	MetricTimerStuck = "keiro.timer.stuck"
	// MetricTimerFireLag names a histogram in s: time from a timer's fire_at to its claim.
	MetricTimerFireLag = "keiro.timer.fire.lag"
	// MetricTimerAttempts names a histogram in {attempt}: the attempt number of each claim.
	MetricTimerAttempts = "keiro.timer.attempts"
	// MetricTimerRequeued names a counter in {timer}: stale firing timers put back.
	MetricTimerRequeued = "keiro.timer.requeued"
)

// SubscriptionNameKey is "keiro.subscription.name", the bounded attribute of
// keiro.projection.lag (an event-store subscription's configured name).
const SubscriptionNameKey = attribute.Key("keiro.subscription.name")

// Metric describes one instrument of keiro's vocabulary.
type Metric struct {
	// Name is the OpenTelemetry instrument name.
	Name string
	// Kind is counter, gauge or histogram.
	Kind Kind
	// Unit is the UCUM unit ("s", "{event}", "{message}").
	Unit string
	// Description is the instrument description (Prometheus HELP).
	Description string
	// Attributes are the only attribute keys its data points carry.
	Attributes []attribute.Key
	// Buckets are the explicit histogram bucket boundaries, installed through a view by
	// otelsetup.Setup and otelsetup.HistogramViews (package tracing/otelsetup); nil for
	// counters and gauges.
	Buckets []float64
}

// LatencyBuckets are the bucket boundaries (seconds) of keiro's duration histograms: from 1 ms
// (a relay on a warm connection) to 5 minutes (a backlog draining after an outage).
var LatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// BatchSizeBuckets are the bucket boundaries of keiro.outbox.batch.size.
var BatchSizeBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}

// MetricNames lists every metric keiro emits, with its kind, unit and attributes. The
// dashboard test and the histogram views of package tracing/otelsetup are built from it; instrument creators should
// use the same Name, Unit and Description.
var MetricNames = []Metric{
	{Name: MetricClientSentMessages, Kind: Counter, Unit: "{message}", Attributes: []attribute.Key{MessagingSystemKey, MessagingOperationNameKey, DestinationKey, ErrorTypeKey},
		Description: "Records the relay produced to Kafka; error.type is set on those that failed."},
	{Name: MetricClientOperationDuration, Kind: Histogram, Unit: "s", Buckets: LatencyBuckets, Attributes: []attribute.Key{MessagingSystemKey, MessagingOperationNameKey, DestinationKey, ErrorTypeKey},
		Description: "Duration of a produce, from the call to the broker's answer."},
	{Name: MetricClientConsumedMessages, Kind: Counter, Unit: "{message}", Attributes: []attribute.Key{MessagingSystemKey, MessagingOperationNameKey, DestinationKey, GroupKey},
		Description: "Records polled from Kafka and handed to the inbox, duplicates included."},
	{Name: MetricProcessDuration, Kind: Histogram, Unit: "s", Buckets: LatencyBuckets, Attributes: []attribute.Key{MessagingSystemKey, MessagingOperationNameKey, DestinationKey, GroupKey, ErrorTypeKey},
		Description: "Duration of processing one message: the inbox transaction with its handler."},

	{Name: MetricOutboxEnqueued, Kind: Counter, Unit: "{event}", Attributes: []attribute.Key{SourceKey, OutcomeKey},
		Description: "Outbox enqueue calls, by outcome: inserted (new row), duplicate (same identity and content), conflict (same identity, different content)."},
	{Name: MetricOutboxPublished, Kind: Counter, Unit: "{event}", Attributes: []attribute.Key{DestinationKey},
		Description: "Outbox rows acknowledged by the broker and marked sent."},
	{Name: MetricOutboxRetried, Kind: Counter, Unit: "{event}", Attributes: []attribute.Key{DestinationKey},
		Description: "Outbox publishes that failed transiently and were scheduled for retry."},
	{Name: MetricOutboxDeadlettered, Kind: Counter, Unit: "{event}", Attributes: []attribute.Key{DestinationKey},
		Description: "Outbox rows marked dead after exhausting their attempts."},
	{Name: MetricOutboxRejected, Kind: Counter, Unit: "{event}", Attributes: []attribute.Key{DestinationKey},
		Description: "Outbox rows rejected at once by a permanent broker error (too large, invalid topic, not authorised)."},
	{Name: MetricOutboxReclaimed, Kind: Counter, Unit: "{event}",
		Description: "Outbox rows whose claim lease expired and were made claimable again."},
	{Name: MetricOutboxOrderBroken, Kind: Counter, Unit: "{event}", Attributes: []attribute.Key{DestinationKey},
		Description: "Outbox rows Kafka acknowledged after an earlier row of their key failed in the same flush: the key is out of order on the topic. Should stay 0."},
	{Name: MetricOutboxBacklog, Kind: Gauge, Unit: "{event}", Attributes: []attribute.Key{DestinationKey},
		Description: "Outbox rows not yet published: pending, failed and publishing."},
	{Name: MetricOutboxOldestPending, Kind: Gauge, Unit: "s", Attributes: []attribute.Key{DestinationKey},
		Description: "Age of the oldest unpublished outbox row (0 when the backlog is empty)."},
	{Name: MetricOutboxDead, Kind: Gauge, Unit: "{event}", Attributes: []attribute.Key{DestinationKey},
		Description: "Outbox rows in a terminal failure state (dead and rejected) waiting for an operator."},
	{Name: MetricOutboxPublishLatency, Kind: Histogram, Unit: "s", Buckets: LatencyBuckets,
		Description: "Time from the outbox row's creation to the broker's acknowledgement."},
	{Name: MetricOutboxBatchSize, Kind: Histogram, Unit: "{event}", Buckets: BatchSizeBuckets,
		Description: "Rows per claimed outbox batch."},
	{Name: MetricOutboxTransactions, Kind: Counter, Unit: "{transaction}", Attributes: []attribute.Key{OutcomeKey},
		Description: "Kafka transactions of an exactly-once relay, by outcome: committed, aborted."},
	{Name: MetricOutboxFenced, Kind: Counter, Unit: "{fence}",
		Description: "Times an exactly-once relay found its transactional id taken over by a newer relay (a zombie fenced)."},

	{Name: MetricInboxProcessed, Kind: Counter, Unit: "{message}", Attributes: []attribute.Key{ConsumerKey, DestinationKey, GroupKey},
		Description: "Messages whose handler ran and committed with the inbox row."},
	{Name: MetricInboxDuplicates, Kind: Counter, Unit: "{message}", Attributes: []attribute.Key{ConsumerKey, DestinationKey, GroupKey},
		Description: "Messages already recorded in the inbox; the handler did not run."},
	{Name: MetricInboxFailed, Kind: Counter, Unit: "{message}", Attributes: []attribute.Key{ConsumerKey, DestinationKey, GroupKey},
		Description: "Handler failures that will be retried."},
	{Name: MetricInboxPoisoned, Kind: Counter, Unit: "{message}", Attributes: []attribute.Key{ConsumerKey, DestinationKey, GroupKey},
		Description: "Messages that failed permanently or past the attempt ceiling."},
	{Name: MetricInboxDeadlettered, Kind: Counter, Unit: "{message}", Attributes: []attribute.Key{ConsumerKey, DestinationKey, GroupKey},
		Description: "Messages written to the dead-letter topic."},
	{Name: MetricInboxDeadLetterValueOmitted, Kind: Counter, Unit: "{message}", Attributes: []attribute.Key{ConsumerKey, DestinationKey, GroupKey},
		Description: "Dead letters too large for Kafka, written with their value omitted (the original stays at its topic, partition and offset)."},
	{Name: MetricInboxDeadLetterFailures, Kind: Counter, Unit: "{produce}", Attributes: []attribute.Key{ConsumerKey, GroupKey, ErrorTypeKey},
		Description: "Dead-letter produces that failed and are retried while their partition waits."},
	{Name: MetricInboxDeadLetterBlocked, Kind: Gauge, Unit: "{partition}", Attributes: []attribute.Key{ConsumerKey, GroupKey},
		Description: "Partitions waiting on a failing dead-letter produce (the dead-letter topic missing, not writable, or Kafka unavailable)."},
	{Name: MetricInboxHandlerDuration, Kind: Histogram, Unit: "s", Buckets: LatencyBuckets,
		Description: "Duration of the handler and its inbox transaction."},
	{Name: MetricInboxBacklog, Kind: Gauge, Unit: "{message}", Attributes: []attribute.Key{ConsumerKey, GroupKey},
		Description: "Inbox rows in the failed state."},
	{Name: MetricConsumerLag, Kind: Gauge, Unit: "{message}", Attributes: []attribute.Key{GroupKey, DestinationKey, PartitionKey},
		Description: "Records between the group's committed offset and the partition's end offset, measured from Kafka for the partitions this member owns."},
	{Name: MetricConsumerFetchPauses, Kind: Counter, Unit: "{pause}", Attributes: []attribute.Key{GroupKey, DestinationKey, PartitionKey},
		Description: "Partition fetches paused because the partition's buffer was full while another partition needed a poll."},
	{Name: MetricConsumerCommitFailures, Kind: Counter, Unit: "{commit}", Attributes: []attribute.Key{GroupKey, DestinationKey, PartitionKey, ErrorTypeKey},
		Description: "Offset commits that failed and are retried after the consumer's backoff."},

	{Name: MetricCommandConflicts, Kind: Counter, Unit: "{conflict}",
		Description: "Appends of a command that met a version conflict."},
	{Name: MetricCommandRetries, Kind: Counter, Unit: "{retry}",
		Description: "Command attempts retried after a conflict."},
	{Name: MetricCommandDuplicates, Kind: Counter, Unit: "{append}",
		Description: "Appends whose event ids were already stored (idempotent repeats and id conflicts)."},
	{Name: MetricSnapshotWriteFailures, Kind: Counter, Unit: "{snapshot}",
		Description: "Advisory snapshots that could not be encoded or written."},
	{Name: MetricSnapshotHits, Kind: Counter, Unit: "{hydration}",
		Description: "Hydrations seeded from a snapshot."},
	{Name: MetricSnapshotMisses, Kind: Counter, Unit: "{hydration}",
		Description: "Hydrations that found no usable snapshot (absent, other state version, undecodable)."},
	{Name: MetricSnapshotApplyDivergence, Kind: Counter, Unit: "{failure}",
		Description: "Just-appended event batches that did not replay to the decided state; no snapshot was written, and the next hydration sees what the log holds."},
	{Name: MetricProjectionLag, Kind: Gauge, Unit: "{event}", Attributes: []attribute.Key{SubscriptionNameKey},
		Description: "Events between the log's head and the subscription's checkpoint."},
	{Name: MetricProjectionWaitTimeouts, Kind: Counter, Unit: "{wait}", Attributes: []attribute.Key{SubscriptionNameKey},
		Description: "Read-model consistency waits that timed out before the subscription reached the target."},
	{Name: MetricOutboxIdentityConflict, Kind: Counter, Unit: "{event}",
		Description: "Producer enqueues whose deterministic message id was already stored with different content."},
	{Name: MetricDispatchPoison, Kind: Counter, Unit: "{input}",
		Description: "Router and process manager inputs that could not be decoded."},
	{Name: MetricDispatchFailed, Kind: Counter, Unit: "{command}",
		Description: "Routed and process manager commands (and resolves) that failed."},
	{Name: MetricDispatchDuplicates, Kind: Counter, Unit: "{command}",
		Description: "Routed and process manager commands an earlier delivery had already dispatched."},
	{Name: MetricDispatchDeadLettered, Kind: Counter, Unit: "{command}",
		Description: "Rejected commands set aside under RejectedDeadLetter or RejectedSkip."},
	{Name: MetricTimerBacklog, Kind: Gauge, Unit: "{timer}",
		Description: "Scheduled timers that are due."},
	{Name: MetricTimerStuck, Kind: Gauge, Unit: "{timer}",
		Description: "Timers a worker claimed and has not finished (firing)."},
	{Name: MetricTimerFireLag, Kind: Histogram, Unit: "s", Buckets: LatencyBuckets,
		Description: "Time from a timer's fire_at to its claim."},
	{Name: MetricTimerAttempts, Kind: Histogram, Unit: "{attempt}", Buckets: []float64{1, 2, 3, 5, 10, 20, 50},
		Description: "The attempt number of each timer claim."},
	{Name: MetricTimerRequeued, Kind: Counter, Unit: "{timer}",
		Description: "Stale firing timers put back to scheduled."},
}
