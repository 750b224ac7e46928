package outbox

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Producer defaults set by ProducerOpts.
const (
	// DefaultRecordRetries bounds franz-go's own retries of a record, after which the relay
	// classifies the error and schedules the row itself.
	DefaultRecordRetries = 5
	// DefaultProduceRequestTimeout bounds one produce request on the broker.
	DefaultProduceRequestTimeout = 10 * time.Second
	// DefaultRecordDeliveryTimeout bounds how long a record may take to be delivered, after
	// which the relay classifies the failure itself (the batch's lease is renewed meanwhile).
	DefaultRecordDeliveryTimeout = 30 * time.Second
	// DefaultMaxBufferedRecords bounds the records buffered before a flush; it must be at
	// least BatchSize × MaxInFlightBatches.
	DefaultMaxBufferedRecords = 1 << 16
	// DefaultMetadataMinAge is the shortest time between two metadata refreshes of the
	// relay's client, franz-go's own 5s lowered to the wait franz-go uses between the retries of
	// an urgent refresh. A record refused because its partition's leader moved
	// (NOT_LEADER_FOR_PARTITION, as a broker answers while its controller fences it and gives
	// it its partitions back, which is what follows a pause past its KRaft session) is
	// retried only after the next refresh; with 5s, that refresh came up to 5s after the
	// client's last one, and the flush waited for it. A flush holds the head of every key of
	// its batches, so every later row of those keys, in every relay, waited too: after a long
	// broker pause, with a backlog over a few hundred keys, the relays published one batch
	// every few seconds instead of draining. A refresh costs the broker one small request.
	DefaultMetadataMinAge = 250 * time.Millisecond
)

// ProducerOpts returns the franz-go options the relay's client must be built with:
// acks from all in-sync replicas, idempotent writes (franz-go's default, not disabled), manual
// flushing (the relay buffers a whole batch and flushes it, so a failure of a partition fails
// every later record of that partition and no later same-key record can overtake a failed one),
// bounded record retries and timeouts so the relay classifies errors itself, and metadata
// refreshed at most DefaultMetadataMinAge apart, so that a partition whose leader moved is
// produced to again within that time rather than franz-go's default 5s. Append seed
// brokers, TLS and SASL options after them. NewRelay rejects a client built without
// acks=all, with idempotency disabled, or without manual flushing.
//
// The relay needs a client of its own: manual flushing means other producers sharing it
// would have to flush too.
func ProducerOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ManualFlushing(),
		kgo.MaxBufferedRecords(DefaultMaxBufferedRecords),
		kgo.RecordRetries(DefaultRecordRetries),
		kgo.ProduceRequestTimeout(DefaultProduceRequestTimeout),
		kgo.RecordDeliveryTimeout(DefaultRecordDeliveryTimeout),
		kgo.MetadataMinAge(DefaultMetadataMinAge),
	}
}
