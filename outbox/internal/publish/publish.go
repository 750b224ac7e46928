// Package publish is the relay's one publisher: both of its sources, the claim engine and the
// log engine, hand it their events, and it turns each into a Kafka record. It owns what the
// two have in common: the checks of the producer client, the largest record and its size,
// the records' headers (keiro's, and CloudEvents' where configured), the suspects retried
// alone, the send span and the send metrics, and the dead-letter sink of the log engine.
package publish

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/kafkaerr"
	"github.com/keiro-go/keiro/tracing"
)

// DefaultMaxRecordBytes is the largest record a client built without ProducerBatchMaxBytes
// can send at all (kafkaerr.DefaultMaxRecordBytes).
const DefaultMaxRecordBytes = kafkaerr.DefaultMaxRecordBytes

// Config configures a Publisher.
type Config struct {
	// Client is the relay's producer, built with outbox.ProducerOpts.
	Client *kgo.Client
	// Buffered is the most records the relay buffers at once: the client's
	// MaxBufferedRecords must be at least that.
	Buffered int
	// MaxRecordBytes is the largest record published; a larger one is rejected without being
	// sent. 0 means the client's ProducerBatchMaxBytes (DefaultMaxRecordBytes unset); a larger
	// value is lowered to it.
	MaxRecordBytes int
	// CloudEvents adds the CloudEvents headers to every record; CloudEventsDestinations to
	// the records of these destinations only.
	CloudEvents             bool
	CloudEventsDestinations []string
	// Tracer starts the send spans; nil: none are recorded.
	Tracer trace.Tracer
	// Meter creates the send instruments; nil: none are recorded.
	Meter metric.Meter
	// DeadLetter makes a rejection durable (see Publisher.DeadLetter); nil: rejections are
	// logged only.
	DeadLetter func(Rejection) error
	// Logger receives the publisher's logs; nil: slog.Default().
	Logger *slog.Logger
}

// Publisher turns events into Kafka records for both relay engines. Build it with New.
type Publisher struct {
	client         *kgo.Client
	maxRecordBytes int
	cloudEvents    bool
	ceDests        []string
	tracer         trace.Tracer
	noopTracer     bool // tracer is a no-op one: sends start no span (StartSend)
	inst           *instruments
	deadLetter     func(Rejection) error
	deadLetters    chan struct{} // the slots of DeadLetter calls running at once
	log            *slog.Logger
}

// New checks cfg's client (CheckClient) and returns its publisher.
func New(cfg Config) (*Publisher, error) {
	maxRecord, err := CheckClient(cfg.Client, cfg.Buffered, cfg.MaxRecordBytes)
	if err != nil {
		return nil, err
	}
	if cfg.Tracer == nil {
		cfg.Tracer = tracenoop.NewTracerProvider().Tracer("")
	}
	_, noopTracer := cfg.Tracer.(tracenoop.Tracer)
	if cfg.Meter == nil {
		cfg.Meter = otel.GetMeterProvider().Meter(tracing.ScopeName) // the global provider, a no-op until one is set
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	inst, err := newInstruments(cfg.Meter)
	if err != nil {
		return nil, err
	}
	return &Publisher{client: cfg.Client, maxRecordBytes: maxRecord, cloudEvents: cfg.CloudEvents,
		ceDests: cfg.CloudEventsDestinations, tracer: cfg.Tracer, noopTracer: noopTracer, inst: inst, deadLetter: cfg.DeadLetter,
		deadLetters: make(chan struct{}, maxDeadLetterWrites), log: cfg.Logger}, nil
}

// CheckClient reports every way client does not suit the relay, at once: acks other than
// from all in-sync replicas, idempotent writes disabled, no manual flushing, a
// MaxBufferedRecords below buffered, a MaxBufferedBytes set. It returns the largest record
// the relay may publish: maxRecord, lowered to the client's ProducerBatchMaxBytes, and
// DefaultMaxRecordBytes when neither is set.
func CheckClient(client *kgo.Client, buffered, maxRecord int) (int, error) {
	if client == nil {
		return 0, errors.New("client is nil")
	}
	var errs []error
	if acks, ok := client.OptValue(kgo.RequiredAcks).(kgo.Acks); !ok || acks != kgo.AllISRAcks() {
		errs = append(errs, errors.New("client: RequiredAcks must be AllISRAcks; build it with outbox.ProducerOpts()"))
	}
	if dis, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); dis {
		errs = append(errs, errors.New("client: idempotent writes are disabled; build it with outbox.ProducerOpts()"))
	}
	if manual, _ := client.OptValue(kgo.ManualFlushing).(bool); !manual {
		errs = append(errs, errors.New("client: ManualFlushing is required; build it with outbox.ProducerOpts()"))
	}
	if n, ok := client.OptValue(kgo.MaxBufferedRecords).(int64); ok && n < int64(buffered) {
		errs = append(errs, fmt.Errorf("client: MaxBufferedRecords (%d) must be at least BatchSize × MaxInFlightBatches (%d)", n, buffered))
	}
	if n, ok := client.OptValue(kgo.MaxBufferedBytes).(int64); ok && n > 0 {
		// Past the limit franz-go fails records before buffering them: every claim would
		// use attempts on rows it never sent.
		errs = append(errs, fmt.Errorf("client: MaxBufferedBytes (%d) must not be set; bound the buffer with MaxBufferedRecords", n))
	}
	if b, ok := client.OptValue(kgo.ProducerBatchMaxBytes).(int32); ok && (maxRecord == 0 || int(b) < maxRecord) {
		maxRecord = int(b)
	}
	if maxRecord == 0 {
		maxRecord = DefaultMaxRecordBytes
	}
	return maxRecord, errors.Join(errs...)
}

// Client is the relay's producer.
func (p *Publisher) Client() *kgo.Client { return p.client }

// MaxRecordBytes is the largest record the publisher sends.
func (p *Publisher) MaxRecordBytes() int { return p.maxRecordBytes }

// MaxBufferedRecords is the client's bound on buffered records; 0 when it has none.
func (p *Publisher) MaxBufferedRecords() int {
	n, _ := p.client.OptValue(kgo.MaxBufferedRecords).(int64)
	return int(n)
}

// Record fills rec's topic, value and headers from ev (the key is the caller's: the claim
// engine copies it, the log engine keeps its decoding's bytes), with the header encoding of
// ev's destination. rec.Headers is reused when it has the room: rec must not be in flight.
// headers is scratch space, returned for the next call.
func (p *Publisher) Record(rec *kgo.Record, ev *envelope.Event, headers []envelope.Header) []envelope.Header {
	rec.Topic, rec.Value = ev.Destination, ev.Payload
	headers = ev.AppendHeaders(headers[:0], envelope.EncodeOptions{
		CloudEvents: p.cloudEvents || slices.Contains(p.ceDests, ev.Destination),
	})
	if cap(rec.Headers) >= len(headers) {
		rec.Headers = rec.Headers[:len(headers)] // a recycled record's (the log engine recycles its rows)
	} else {
		rec.Headers = make([]kgo.RecordHeader, len(headers))
	}
	for i, h := range headers {
		rec.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return headers
}

// CheckSize returns rec's size (RecordSize) and, when it is larger than MaxRecordBytes, the
// reason it is rejected without being sent.
func (p *Publisher) CheckSize(rec *kgo.Record) (int, error) {
	size := RecordSize(rec)
	if size > p.maxRecordBytes {
		return size, fmt.Errorf("record of about %d bytes exceeds the %d-byte limit (MaxRecordBytes / ProducerBatchMaxBytes)", size, p.maxRecordBytes)
	}
	return size, nil
}

// RecordSize is an upper bound of rec's size inside a Kafka record batch.
func RecordSize(rec *kgo.Record) int {
	n := 61 + 21 + len(rec.Key) + len(rec.Value) // batch header + record framing
	for _, h := range rec.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}
