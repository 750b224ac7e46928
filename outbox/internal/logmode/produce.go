package logmode

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/kafkaerr"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// produce sends r's record as part of t. A record larger than MaxRecordBytes is rejected
// without being sent. A suspect (publish.Suspects) is produced alone: after every record before
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
		s.w.add(t, 0)
		s.reject(t, 0, ev, kafkaerr.CodeMessageTooLarge, err)
		return
	}
	alone := e.suspects.Take(ev.MessageID)
	if alone {
		s.drain(ctx)
	}
	s.w.add(t, size)
	e.producer.Produce(context.Background(), rec, func(rec *kgo.Record, err error) {
		send.Done(rec, err, t.at)
		if err == nil {
			e.published.Add(1)
			e.pub.AddPublished(context.Background(), 1, rec.Topic)
			if e.onAck != nil {
				e.onAck(ev.MessageID)
			}
		} else if class, code := kafkaerr.OfLogRecord(err); class == kafkaerr.Permanent {
			// Otherwise the transaction fails: the session ends and the next replays it.
			if kafkaerr.Suspect(err, !alone) {
				e.suspects.Add(ev.MessageID)
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

// reject writes ev's dead letter through the publisher's DeadLetter, off the caller's goroutine (a producer
// promise must not wait on the database), and then settles ev's record, in flight until then:
// ev's transaction is confirmed only once the rejection is durable. A sink that fails
// settles the record as failed: the session ends, and the next one replays the transaction,
// rejects ev again and writes again.
func (s *stream) reject(t *txn, size int, ev *envelope.Event, code string, refusal error) {
	e := s.e
	r := publish.Rejection{MessageID: ev.MessageID, Source: ev.Source, Destination: ev.Destination, Key: ev.Key,
		Code: code, Err: refusal, Event: ev}
	go func() {
		err := e.pub.DeadLetter(r)
		if err != nil {
			err = fmt.Errorf("write the dead letter of message %s (%s): %w", r.MessageID, code, err)
		} else {
			e.rejected.Add(1)
		}
		s.w.settle(t, size, err)
	}()
}
