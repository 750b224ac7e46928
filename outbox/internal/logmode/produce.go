package logmode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/kafkaerr"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// produce sends r's record as part of t. A record larger than MaxRecordBytes is rejected
// without being sent. A suspect (publish.Suspects) is produced alone: after every record before
// it settled, and settled itself before the next one is produced. franz-go holds r.rec, and
// its promise r.ev, until the promise ran; the promise recycles r once Kafka acknowledged it
// (row.recycle), after its last read of it.
//
// Under exactly once the record goes into the stream's open Kafka transaction (begun here if
// none is open), and a record Kafka refused for itself when produced alone is rejected and the
// transaction fails (see refusals).
func (s *stream) produce(ctx context.Context, t *txn, r *row) error {
	e := s.e
	ev := &r.ev
	if s.eo != nil {
		if e.refused.has(refusedKey{t.final, ev.MessageID}) {
			// Refused by Kafka alone in an earlier session, whose transaction was aborted for
			// it once its dead letter was durable: the replay skips it.
			return nil
		}
	}
	if code, err := kafkaerr.CheckTopic(ev.Destination); err != nil {
		// No produce of it can succeed (franz-go refuses an empty topic itself): a
		// rejection, in flight (of no bytes) until its dead letter is written.
		s.w.add(t, 0, false)
		s.reject(t, 0, ev, code, err, false)
		return nil
	}
	send, tc := e.pub.StartSend(ev)
	encoded := ev
	if tc != nil {
		c := *ev
		c.TraceContext = tc
		encoded = &c
	}
	rec := &r.rec
	s.headers = e.pub.Record(rec, encoded, s.headers)
	size, err := e.pub.CheckSize(rec)
	if err != nil {
		// In flight (of no bytes: nothing is sent) until its dead letter is written.
		send.Rejected(kafkaerr.CodeMessageTooLarge)
		s.w.add(t, 0, false)
		s.reject(t, 0, ev, kafkaerr.CodeMessageTooLarge, err, false)
		return nil
	}
	alone := e.suspects.Take(ev.MessageID)
	if alone {
		s.drain(ctx)
	}
	if s.eo != nil {
		if err := s.eo.Begin(); err != nil {
			return fmt.Errorf("exactly once: %w", err)
		}
		if s.inKafka == 0 {
			s.kafkaBegan = time.Now()
		}
		s.inKafka++
	}
	inTxn := s.eo != nil // the promise does not read s.eo: the stream changes it (commitKafka)
	s.w.add(t, size, inTxn)
	s.send(rec, func(rec *kgo.Record, err error) {
		send.Done(rec, err, t.at)
		if err == nil {
			e.published.Add(1)
			e.pub.AddPublished(context.Background(), 1, rec.Topic)
			if e.onAck != nil {
				e.onAck(ev.MessageID)
			}
		} else if class, code := kafkaerr.OfLogRecord(err); class == kafkaerr.Permanent {
			// Otherwise the transaction fails: the session ends and the next replays it.
			switch {
			case kafkaerr.Suspect(err, !alone):
				e.suspects.Add(ev.MessageID)
				err = fmt.Errorf("%w (message %s is produced alone by the next session)", err, ev.MessageID)
			case inTxn:
				// Its Kafka transaction cannot commit without it (the records of the
				// transaction must all be there or none): rejected, then failed, so that the
				// transaction is aborted and replayed without it.
				s.reject(t, size, ev, code, err, true)
				return
			default:
				s.reject(t, size, ev, code, err, false)
				return
			}
		}
		s.w.settle(t, size, err)
		if err == nil {
			r.recycle()
		}
	})
	if alone {
		s.drain(ctx)
	}
	return nil
}

// drain flushes and waits until no record is in flight, or ctx ends.
func (s *stream) drain(ctx context.Context) {
	for s.w.inFlight() > 0 {
		s.release()
		s.flushNow()
		select {
		case <-ctx.Done():
			return
		case <-s.w.settled:
		case <-s.hold:
		}
	}
}

// heldRecord is a record produced while the Kafka transaction before it waits for its records
// (exactly once), and its promise.
type heldRecord struct {
	rec     *kgo.Record
	promise func(*kgo.Record, error)
}

// send hands rec to the stream's producer, or holds it while the committing transaction's
// records have not all settled (hold): on each partition a record must follow those of the
// transaction before it, so that each key keeps its order, and franz-go's manual flushing is
// no gate (a drain under way sends what is buffered). The stream reads on meanwhile; release
// produces the held records, in order, once hold is closed.
func (s *stream) send(rec *kgo.Record, promise func(*kgo.Record, error)) {
	s.release()
	if s.hold != nil {
		s.held = append(s.held, heldRecord{rec, promise})
		return
	}
	s.cl.Produce(context.Background(), rec, promise)
}

// release produces the held records, in order, if the records they wait for have settled.
func (s *stream) release() {
	if s.hold == nil {
		return
	}
	select {
	case <-s.hold:
	default:
		return
	}
	s.hold = nil
	for i, h := range s.held {
		s.cl.Produce(context.Background(), h.rec, h.promise)
		s.held[i] = heldRecord{}
	}
	if len(s.held) > 0 {
		s.held = s.held[:0]
		s.flushNow()
	}
}

// reject writes ev's dead letter through the publisher's DeadLetter, off the caller's goroutine (a producer
// promise must not wait on the database), and then settles ev's record, in flight until then:
// ev's transaction is confirmed only once the rejection is durable. A sink that fails
// settles the record as failed: the session ends, and the next one replays the transaction,
// rejects ev again and writes again.
//
// inTxn is a record Kafka refused inside a Kafka transaction (exactly once): once its dead letter
// is durable the engine remembers the refusal (replays skip ev), and the record settles as failed all the same, which aborts the Kafka transaction.
func (s *stream) reject(t *txn, size int, ev *envelope.Event, code string, cause error, inTxn bool) {
	e := s.e
	r := publish.Rejection{MessageID: ev.MessageID, Source: ev.Source, Destination: ev.Destination, Key: ev.Key,
		Code: code, Err: cause, Event: ev}
	go func() {
		err := e.pub.DeadLetter(r)
		if err != nil {
			err = fmt.Errorf("write the dead letter of message %s (%s): %w", r.MessageID, code, err)
		} else {
			e.rejected.Add(1)
			if inTxn {
				e.refused.add(refusedKey{t.final, r.MessageID})
				err = fmt.Errorf("%w: message %s (%s): %w", errRefusedInTxn, r.MessageID, code, r.Err)
			}
		}
		s.w.settle(t, size, err)
	}()
}

// errRefusedInTxn fails a Kafka transaction one of whose records Kafka refused for good: the
// record is rejected, and the transaction aborted and replayed without it.
var errRefusedInTxn = errors.New("exactly once: a record of the Kafka transaction was refused; the transaction is replayed without it")

// refusals are the messages Kafka refused for good inside a Kafka transaction (exactly once),
// by their PostgreSQL transaction and message id, whose dead letters are written: the transaction was aborted for them, and
// its replay skips them. It lives as long as the engine and holds only such messages; a new
// process learns them again (the suspect is produced alone, refused, its dead letter written
// again, which the sink does idempotently, and the transaction replayed).
type refusals struct {
	mu  sync.Mutex
	ids map[refusedKey]struct{}
}

// refusedKey is a refused record: its transaction's commit LSN (the Begin message's FinalLSN,
// the same in every replay) and its message id.
type refusedKey struct {
	final pglogrepl.LSN
	id    string
}

func (r *refusals) add(id refusedKey) {
	r.mu.Lock()
	if r.ids == nil {
		r.ids = map[refusedKey]struct{}{}
	}
	r.ids[id] = struct{}{}
	r.mu.Unlock()
}

func (r *refusals) has(id refusedKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[id]
	return ok
}
