package events

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/tracing"
)

// ProducerIdentityVersion is the version of the deterministic producer identity (keiro's
// Keiro.Outbox.Identity v1). Its bytes are frozen.
const ProducerIdentityVersion = 1

var messageIDPrefix = regexp.MustCompile(`^[a-z]{1,63}$`)

// ErrInvalidMessageIDPrefix reports a message id prefix that breaks keiro's TypeID prefix rule.
var ErrInvalidMessageIDPrefix = errors.New("invalid message id prefix")

// ValidateMessageIDPrefix checks keiro's rule for producer message id prefixes: 1 to 63
// lowercase latin letters.
func ValidateMessageIDPrefix(prefix string) error {
	if !messageIDPrefix.MatchString(prefix) {
		return fmt.Errorf("%w %q: use 1 to 63 lowercase latin letters, for example \"msg\"", ErrInvalidMessageIDPrefix, prefix)
	}
	return nil
}

// ProducerIdentity is the deterministic identity of one integration event minted from one
// private event.
type ProducerIdentity struct {
	// Digest is SHA-256 of the canonical identity bytes.
	Digest [32]byte
	// OutboxID is a UUIDv8 made of the digest's first 16 bytes.
	OutboxID envelope.UUID
	// MessageID is prefix + "_v1_" + the digest in lowercase hex.
	MessageID string
}

// NewProducerIdentity derives the identity of emission number emission of the private event
// sourceEventID by producer name of bounded context source, byte for byte as keiro does
// (Keiro.Outbox.Identity v1): six fields, each an unsigned 64-bit big-endian length followed by
// the bytes — ASCII "keiro.producer.outbox", the version as u16 big-endian, UTF-8 source, UTF-8
// name, the 16 UUID bytes, emission as u32 big-endian — hashed with SHA-256. The prefix is not
// part of the hash. The same inputs always give the same ids, so a replay enqueues duplicates
// that the outbox recognises, never new messages.
func NewProducerIdentity(prefix, source, name string, sourceEventID envelope.UUID, emission uint32) ProducerIdentity {
	sum := sha256.Sum256(producerIdentityBytes(source, name, sourceEventID, emission))
	var id envelope.UUID
	copy(id[:], sum[:16])
	id[6] = id[6]&0x0f | 0x80 // version 8
	id[8] = id[8]&0x3f | 0x80 // RFC 9562 variant
	return ProducerIdentity{Digest: sum, OutboxID: id, MessageID: prefix + "_v1_" + hex.EncodeToString(sum[:])}
}

func producerIdentityBytes(source, name string, id envelope.UUID, emission uint32) []byte {
	var version [2]byte
	binary.BigEndian.PutUint16(version[:], ProducerIdentityVersion)
	var idx [4]byte
	binary.BigEndian.PutUint32(idx[:], emission)
	fields := [][]byte{[]byte("keiro.producer.outbox"), version[:], []byte(source), []byte(name), id[:], idx[:]}
	var b []byte
	for _, f := range fields {
		b = binary.BigEndian.AppendUint64(b, uint64(len(f)))
		b = append(b, f...)
	}
	return b
}

// MapFunc maps a private event to the integration events it publishes (none to skip it). The
// producer fills MessageID (deterministic; leave it empty), Source (when empty), and the
// provenance and causal fields the mapper leaves unset; see ProducerConfig. It must be
// deterministic: a replay must map an event to the same integration events.
type MapFunc func(e RecordedEvent) ([]envelope.Event, error)

// ProducerConfig configures an integration Producer.
type ProducerConfig struct {
	// Name identifies the producer: it is the subscription's checkpoint name and part of every
	// message id's hash, so renaming it re-publishes history under new ids. Required.
	Name string
	// Source is the producing bounded context, stamped on every event and part of the hash.
	// Required.
	Source string
	// MessageIDPrefix starts every message id ("msg" → "msg_v1_<sha256 hex>"): 1 to 63
	// lowercase latin letters. Required.
	MessageIDPrefix string
	// Map maps private events to integration events. Required.
	Map MapFunc
	// Outbox is the outbox the events are enqueued to, in the checkpoint's transaction. Required.
	Outbox *outbox.Store
	// Category restricts the producer to one category's streams. Defaults to "" (whole log).
	Category string
	// BatchSize is the number of private events per transaction. Defaults to DefaultBatchSize.
	BatchSize int
	// PollInterval: see SubscriptionConfig. Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// DisableListen: see SubscriptionConfig. Defaults to false.
	DisableListen bool
	// Republish makes a replay enqueue again the events at or below the producer's mark (the
	// highest position it ever enqueued), which it otherwise skips and reports: a replay
	// after the outbox's retention deleted the original rows would publish those messages a
	// second time (under the same message ids, so consumers dedupe them only within their inbox
	// window). Set it to re-publish history on purpose, for example after consumers lost
	// data, or to check a changed mapper against the retained rows. Defaults to false (skip).
	Republish bool
	// Retry: see SubscriptionConfig. A mapper error is permanent (the mapper is deterministic):
	// the event is dead-lettered (or halts) without further deliveries; enqueue failures are
	// retried. An identity conflict always halts. Defaults to SubscriptionConfig's defaults.
	Retry RetryPolicy
	// AfterCommit: see SubscriptionConfig. Defaults to nil.
	AfterCommit func(position int64)
	// MeterProvider provides the meter for keiro.projection.lag and
	// keiro.outbox.identity.conflict. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger: see SubscriptionConfig. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *ProducerConfig) validate() error {
	var errs []error
	if c.Source == "" {
		errs = append(errs, errors.New("Source: required"))
	}
	if err := ValidateMessageIDPrefix(c.MessageIDPrefix); err != nil {
		errs = append(errs, fmt.Errorf("MessageIDPrefix: %w", err))
	}
	if c.Map == nil {
		errs = append(errs, errors.New("Map: required"))
	}
	if c.Outbox == nil {
		errs = append(errs, errors.New("Outbox: required"))
	}
	return errors.Join(errs...)
}

// Producer is the integration producer: a subscription that maps private events to integration
// events and enqueues them to the outbox in the same transaction as its checkpoint, under
// deterministic message ids. A replay (Rebuild, a crash before the checkpoint) enqueues
// duplicates that the outbox recognises, so the relay never publishes a second id for one fact.
// If the outbox already holds a message id with different content (the mapper changed), the
// batch rolls back and Run stops with an error wrapping outbox.ErrIdentityConflict.
type Producer struct {
	cfg       ProducerConfig
	store     *Store
	sub       *Subscription
	conflicts metric.Int64Counter
	skipped   metric.Int64Counter
}

// NewProducer returns a Producer, reporting every configuration problem at once.
func NewProducer(store *Store, pool *pgxpool.Pool, cfg ProducerConfig) (*Producer, error) {
	verr := cfg.validate()
	p := &Producer{cfg: cfg, store: store}
	sub, serr := NewBatchSubscription(store, pool, SubscriptionConfig{
		Name: cfg.Name, Category: cfg.Category, BatchSize: cfg.BatchSize, PollInterval: cfg.PollInterval,
		DisableListen: cfg.DisableListen, Retry: cfg.Retry, AfterCommit: cfg.AfterCommit, MeterProvider: cfg.MeterProvider, Logger: cfg.Logger,
	}, p.handle)
	if err := errors.Join(verr, serr); err != nil {
		return nil, fmt.Errorf("new integration producer %q: %w", cfg.Name, err)
	}
	p.sub = sub
	c, err := sub.cfg.MeterProvider.Meter(instrumentationScope).Int64Counter("keiro.outbox.identity.conflict",
		metric.WithDescription("Producer enqueues whose deterministic message id was already stored with different content."),
		metric.WithUnit("{event}"))
	if err != nil {
		return nil, fmt.Errorf("new integration producer %q: %w", cfg.Name, err)
	}
	p.conflicts = c
	if p.skipped, err = sub.cfg.MeterProvider.Meter(instrumentationScope).Int64Counter("keiro.producer.replay.skipped",
		metric.WithDescription("Private events a producer replay did not enqueue again: at or below the producer's mark."),
		metric.WithUnit("{event}")); err != nil {
		return nil, fmt.Errorf("new integration producer %q: %w", cfg.Name, err)
	}
	return p, nil
}

// Run runs the producer's subscription; see Subscription.Run.
func (p *Producer) Run(ctx context.Context) error { return p.sub.Run(ctx) }

// Subscription returns the producer's subscription (for Position and Rebuild).
func (p *Producer) Subscription() *Subscription { return p.sub }

// FreshEvent returns e with the producer's Source and a fresh message id: a TypeID under
// MessageIDPrefix ("msg_01h455vb4pex5vsknk084sn02q", envelope.NewTypeID), unique and sorting by
// creation time (keiro's freshIntegrationEvent, formerly mintIntegrationEvent). It is for an
// integration event a service enqueues itself rather than maps from a private event: a mapped
// event's id is derived from its source event (Events), so that a replay enqueues a duplicate;
// a fresh id is new on every call, so a retried enqueue of a fresh event is a second message.
func (p *Producer) FreshEvent(e envelope.Event) envelope.Event {
	id, err := envelope.NewTypeID(p.cfg.MessageIDPrefix)
	if err != nil {
		// NewProducer validated the prefix: 1 to 63 lowercase letters, a valid TypeID prefix.
		panic(fmt.Sprintf("keiro: message id prefix %q: %v", p.cfg.MessageIDPrefix, err))
	}
	e.Source, e.MessageID = p.cfg.Source, id
	return e
}

// Events maps e and stamps the producer's fields on the result, without enqueuing.
func (p *Producer) Events(e RecordedEvent) ([]envelope.Event, error) {
	out, _, err := p.events(e)
	return out, err
}

// events maps e and returns the integration events with their deterministic outbox ids.
func (p *Producer) events(e RecordedEvent) ([]envelope.Event, []envelope.UUID, error) {
	out, err := p.cfg.Map(e)
	if err != nil {
		return nil, nil, fmt.Errorf("map event %s (%s@%d): %w", e.ID, e.StreamName, e.StreamVersion, err)
	}
	ids := make([]envelope.UUID, len(out))
	for i := range out {
		ie := &out[i]
		if ie.MessageID != "" {
			return nil, nil, fmt.Errorf("map event %s: integration event %d sets MessageID; leave it empty, the producer derives it", e.ID, i)
		}
		if ie.Source == "" {
			ie.Source = p.cfg.Source
		} else if ie.Source != p.cfg.Source {
			return nil, nil, fmt.Errorf("map event %s: integration event %d has source %q, the producer's is %q", e.ID, i, ie.Source, p.cfg.Source)
		}
		id := NewProducerIdentity(p.cfg.MessageIDPrefix, p.cfg.Source, p.cfg.Name, e.ID, uint32(i))
		ie.MessageID, ids[i] = id.MessageID, id.OutboxID
		if ie.SourceEventID == nil {
			id := e.ID
			ie.SourceEventID = &id
		}
		if ie.SourceGlobalPosition == nil {
			pos := e.GlobalPosition
			ie.SourceGlobalPosition = &pos
		}
		if ie.CausationID == nil {
			id := e.ID
			ie.CausationID = &id
		}
		if ie.CorrelationID == nil {
			ie.CorrelationID = e.Metadata.CorrelationID
		}
		if ie.TraceContext == nil {
			ie.TraceContext = e.Metadata.TraceContext
		}
		if ie.OccurredAt.IsZero() {
			ie.OccurredAt = e.RecordedAt
		}
		ie.OccurredAt = ie.OccurredAt.UTC().Truncate(time.Microsecond)
	}
	return out, ids, nil
}

func (p *Producer) handle(ctx context.Context, tx pgx.Tx, batch []RecordedEvent) error {
	var mark int64
	if err := tx.QueryRow(ctx, p.store.q.producerMark, p.cfg.Name).Scan(&mark); err != nil {
		return fmt.Errorf("integration producer %s: read its mark: %w", p.cfg.Name, err)
	}
	var all []envelope.Event
	var ids []envelope.UUID
	var skipped []RecordedEvent
	for _, e := range batch {
		// A dead letter's replay is below the mark (later events moved it) but was never
		// enqueued: it goes through.
		if e.GlobalPosition <= mark && !p.cfg.Republish && !IsDeadLetterReplay(ctx) {
			skipped = append(skipped, e)
			continue
		}
		out, oids, err := p.events(e)
		if err != nil {
			return &eventError{position: e.GlobalPosition, err: Permanent(err)}
		}
		all, ids = append(all, out...), append(ids, oids...)
	}
	if len(skipped) > 0 {
		p.skipped.Add(ctx, int64(len(skipped)), metric.WithAttributes(tracing.SubscriptionNameKey.String(p.cfg.Name)))
		p.sub.cfg.Logger.WarnContext(ctx, "keiro: integration producer replay skipped events it had already enqueued; set ProducerConfig.Republish to publish them again",
			"producer", p.cfg.Name, "events", len(skipped), "first_position", skipped[0].GlobalPosition,
			"last_position", skipped[len(skipped)-1].GlobalPosition, "mark", mark)
	}
	if last := batch[len(batch)-1].GlobalPosition; last > mark {
		if _, err := tx.Exec(ctx, p.store.q.producerMarkSave, p.cfg.Name, last); err != nil {
			return fmt.Errorf("integration producer %s: save its mark: %w", p.cfg.Name, err)
		}
	}
	if len(all) == 0 {
		return nil
	}
	// No ambient span: an event without a trace context must not pick up the producer's, or
	// a replay would store a different row than the first run.
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	res, err := p.cfg.Outbox.EnqueueWithIDsTx(ctx, tx, ids, all...)
	if err != nil {
		if errors.Is(err, outbox.ErrIdentityConflict) {
			n := int64(0)
			for _, r := range res {
				if r.Outcome == outbox.Conflict {
					n++
				}
			}
			p.conflicts.Add(ctx, max(n, 1))
			return &haltError{fmt.Errorf("integration producer %s: the outbox already holds these message ids with different content "+
				"(did the mapper change?); the checkpoint stays put until this is resolved: %w", p.cfg.Name, err)}
		}
		return fmt.Errorf("integration producer %s: enqueue: %w", p.cfg.Name, err)
	}
	return nil
}
