package outbox

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
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

// errClass is how the relay treats a produce error.
type errClass int

const (
	// classTransient: the row failed; it uses an attempt and is retried after backoff, and
	// goes dead when attempts are exhausted.
	classTransient errClass = iota
	// classOutage: Kafka (or the path to it) is unavailable; the row is retried after a
	// relay-wide backoff WITHOUT using an attempt, so an outage never kills rows.
	classOutage
	// classPermanent: Kafka refuses this record for good; the row is rejected at once.
	classPermanent
)

// permanentErrors are the broker errors that reject a record for good (keiro §1.4 item 2).
// UnknownTopicOrPartition is deliberately transient: a topic created late (or auto-created)
// must not lose rows; if it never appears, the row dies after MaxAttempts and can be requeued.
// ClusterAuthorizationFailed is an outage: it concerns the relay's credentials, not the row,
// so rows wait (without using attempts) until the ACLs are fixed.
var permanentErrors = []*kerr.Error{
	kerr.MessageTooLarge,
	kerr.RecordListTooLarge,
	kerr.InvalidTopicException,
	kerr.TopicAuthorizationFailed,
	kerr.InvalidRecord,
	kerr.CorruptMessage,
	kerr.UnsupportedForMessageFormat,
	kerr.PolicyViolation,
}

// classify maps a produce error to its class and, for permanent errors, the rejection code
// (the Kafka error name, lowercased).
func classify(err error) (errClass, string) {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		for _, p := range permanentErrors {
			if ke == p {
				return classPermanent, strings.ToLower(ke.Message)
			}
		}
		switch {
		case ke == kerr.UnknownTopicOrPartition || ke == kerr.UnknownTopicID:
			return classTransient, ""
		case ke == kerr.ClusterAuthorizationFailed || ke.Retriable:
			return classOutage, ""
		}
		return classTransient, ""
	}
	var ne net.Error
	switch {
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.As(err, &ne):
		return classOutage, ""
	}
	return classTransient, ""
}

// recordSize is an upper bound of rec's size inside a Kafka record batch.
func recordSize(rec *kgo.Record) int {
	n := 61 + 21 + len(rec.Key) + len(rec.Value) // batch header + record framing
	for _, h := range rec.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}
