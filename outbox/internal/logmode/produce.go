package logmode

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/kafkaerr"
)

// Rejection is an event that cannot be published: Kafka refused it for good, its topic is
// not a legal name or stayed unknown past UnknownTopicRetries, it is larger than
// MaxRecordBytes, or its row does not decode into an event. The stream moves on past it; its
// transaction is confirmed once OnRejected wrote it.
type Rejection struct {
	// MessageID and Source identify the event.
	MessageID, Source string
	// Destination is the topic it was produced to.
	Destination string
	// Key is its Kafka key; nil when it has none.
	Key *string
	// Code is the rejection code, the Kafka error name in lower case
	// ("message_too_large", ...) or one of kafkaerr's own (invalid_topic,
	// unknown_topic_or_partition, undecodable_row), as the claim relay's rejection_code.
	Code string
	// Err is the refusal.
	Err error
	// Event is the decoded event, whole: what a dead letter keeps.
	Event *envelope.Event
}

// maxDeadLetterWrites bounds the OnRejected calls running at once: a burst of rejections
// takes a few database connections, not one per record.
const maxDeadLetterWrites = 4

// deadLetters are the engine's slots for OnRejected calls.
type deadLetters struct {
	once  sync.Once
	slots chan struct{}
}

func (d *deadLetters) acquire() {
	d.once.Do(func() { d.slots = make(chan struct{}, maxDeadLetterWrites) })
	d.slots <- struct{}{}
}

func (d *deadLetters) release() { <-d.slots }

// suspects are the message ids whose record Kafka refused as too large or invalid in a
// request that may have held other records of its partition: a poison record fails its
// bystanders. The next session produces each of them alone, and rejects it only if Kafka
// refuses it alone. Bounded: a suspect is forgotten once produced alone.
type suspects struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (s *suspects) add(id string) {
	s.mu.Lock()
	if s.ids == nil {
		s.ids = map[string]bool{}
	}
	s.ids[id] = true
	s.mu.Unlock()
}

func (s *suspects) take(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ids[id] {
		return false
	}
	delete(s.ids, id)
	return true
}

// record builds the Kafka record of r in r.rec with the envelope's header encoding, exactly
// as the claim relay does (envelope.Event.AppendHeaders with the destination's options). ev is
// r's event, or a copy of it with another trace context (OnSend). The key's bytes are the
// decoding's (layout.row); the value is the payload itself, not a copy.
func (e *Engine) record(r *row, ev *envelope.Event, headers []envelope.Header) []envelope.Header {
	rec := &r.rec
	rec.Topic, rec.Value = ev.Destination, ev.Payload
	headers = ev.AppendHeaders(headers[:0], envelope.EncodeOptions{
		CloudEvents: e.cfg.CloudEvents || slices.Contains(e.cfg.CloudEventsDestinations, ev.Destination),
	})
	rec.Headers = make([]kgo.RecordHeader, len(headers))
	for i, h := range headers {
		rec.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return headers
}

// recordSize is an upper bound of rec's size inside a Kafka record batch (the claim relay's
// measure).
func recordSize(rec *kgo.Record) int {
	n := 61 + 21 + len(rec.Key) + len(rec.Value) // batch header + record framing
	for _, h := range rec.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

// produce sends r's record as part of t. A record larger than MaxRecordBytes is rejected
// without being sent. A suspect (see suspects) is produced alone: after every record before
// it settled, and settled itself before the next one is produced. r is not reused: franz-go
// holds r.rec, and its promise r.ev, until the promise ran.
func (s *stream) produce(ctx context.Context, t *txn, r *row) {
	e := s.e
	ev := &r.ev
	if code, err := kafkaerr.CheckTopic(ev.Destination); err != nil {
		// No produce of it can succeed (franz-go refuses an empty topic itself): a
		// rejection, in flight (of no bytes) until its dead letter is written.
		s.w.add(t, 0)
		s.reject(t, 0, ev, code, err)
		return
	}
	done := func(*kgo.Record, error) {}
	encoded := ev
	if e.cfg.OnSend != nil {
		var tc *envelope.TraceContext
		tc, done = e.cfg.OnSend(ev, t.at)
		if tc != nil {
			c := *ev
			c.TraceContext = tc
			encoded = &c
		}
	}
	s.headers = e.record(r, encoded, s.headers)
	rec := &r.rec
	size := recordSize(rec)
	if size > e.maxRecordBytes {
		// In flight (of no bytes: nothing is sent) until its dead letter is written.
		err := fmt.Errorf("record of about %d bytes exceeds the %d-byte limit (MaxRecordBytes / ProducerBatchMaxBytes)", size, e.maxRecordBytes)
		done(nil, err)
		s.w.add(t, 0)
		s.reject(t, 0, ev, kafkaerr.CodeMessageTooLarge, err)
		return
	}
	alone := e.suspects.take(ev.MessageID)
	if alone {
		s.drain(ctx)
	}
	s.w.add(t, size)
	e.producer.Produce(context.Background(), rec, func(rec *kgo.Record, err error) {
		done(rec, err)
		if err == nil {
			e.published.Add(1)
			if e.onAck != nil {
				e.onAck(ev.MessageID)
			}
		} else if class, code := kafkaerr.OfLogRecord(err); class == kafkaerr.Permanent {
			// Otherwise the transaction fails: the session ends and the next replays it.
			if kafkaerr.Suspect(err, !alone) {
				e.suspects.add(ev.MessageID)
				err = fmt.Errorf("%w (message %s is produced alone by the next session)", err, ev.MessageID)
			} else {
				s.reject(t, size, ev, code, err)
				return
			}
		}
		s.w.settle(t, size, err)
	})
	if alone {
		s.drain(ctx)
	}
}

// drain flushes and waits until no record is in flight, or ctx ends.
func (s *stream) drain(ctx context.Context) {
	for s.w.inFlight() > 0 {
		s.flushNow()
		select {
		case <-ctx.Done():
			return
		case <-s.w.settled:
		}
	}
}

// reject writes ev's dead letter through OnRejected, off the caller's goroutine (a producer
// promise must not wait on the database), and then settles ev's record, in flight until then:
// ev's transaction is confirmed only once the rejection is durable. A sink that fails
// settles the record as failed: the session ends, and the next one replays the transaction,
// rejects ev again and writes again.
func (s *stream) reject(t *txn, size int, ev *envelope.Event, code string, refusal error) {
	e := s.e
	r := Rejection{MessageID: ev.MessageID, Source: ev.Source, Destination: ev.Destination, Key: ev.Key,
		Code: code, Err: refusal, Event: ev}
	go func() {
		e.deadLetters.acquire()
		err := e.deadLetter(r)
		e.deadLetters.release()
		if err != nil {
			err = fmt.Errorf("write the dead letter of message %s (%s): %w", r.MessageID, code, err)
		} else {
			e.rejected.Add(1)
		}
		s.w.settle(t, size, err)
	}()
}

// deadLetter hands r to OnRejected, or logs it when there is none.
func (e *Engine) deadLetter(r Rejection) error {
	if e.cfg.OnRejected != nil {
		return e.cfg.OnRejected(r)
	}
	e.log.Error("log mode: Kafka refused an event for good; the stream moves on",
		"message_id", r.MessageID, "source", r.Source, "destination", r.Destination, "code", r.Code, "err", r.Err)
	return nil
}
