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
)

// ProducerOpts returns the franz-go options the relay's client must be built with:
// acks from all in-sync replicas, idempotent writes (franz-go's default, not disabled), manual
// flushing (the relay buffers a whole batch and flushes it, so a failure of a partition fails
// every later record of that partition and no later same-key record can overtake a failed one),
// bounded record retries and timeouts so the relay classifies errors itself. Append seed
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
	}
}

// recordSize is an upper bound of rec's size inside a Kafka record batch.
func recordSize(rec *kgo.Record) int {
	n := 61 + 21 + len(rec.Key) + len(rec.Value) // batch header + record framing
	for _, h := range rec.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}
