package inbox

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A worker's produce of a record to the dead-letter topic (the headers and reasons it sets
// are in deadletter.go).

// maxDLQErrorLen bounds the error text a dead letter carries (HeaderDLQError).
const maxDLQErrorLen = 4 << 10

// deadLetter produces r to the dead-letter topic and waits for the acknowledgement, retrying
// failed produces; it never drops. false means the worker stopped first (r is not committed
// and will be redelivered).
func (w *partitionWorker) deadLetter(r *kgo.Record, reason string, cause error, attempts int) bool {
	errText := ""
	if cause != nil {
		errText = cause.Error()
		if len(errText) > maxDLQErrorLen {
			errText = errText[:maxDLQErrorLen]
		}
	}
	c := w.c
	topic := c.deadLetterTopic(r.Topic)
	for n := 0; ; n++ {
		headers := make([]kgo.RecordHeader, 0, len(r.Headers)+8)
		headers = append(headers, r.Headers...)
		headers = append(headers,
			kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(reason)},
			kgo.RecordHeader{Key: HeaderDLQError, Value: []byte(errText)},
			kgo.RecordHeader{Key: HeaderDLQAttempts, Value: []byte(strconv.Itoa(attempts))},
			kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
			kgo.RecordHeader{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
			kgo.RecordHeader{Key: HeaderDLQConsumer, Value: []byte(c.cfg.Store.Consumer)},
			kgo.RecordHeader{Key: HeaderDLQAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		)
		out := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: headers}
		err := w.cl.ProduceSync(w.ctx, out).FirstErr()
		if err == nil {
			c.deadLettered.Add(1)
			c.in.deadlettered.Add(w.ctx, 1, c.in.messageAttrs(c.cfg.Store.Consumer, r.Topic))
			c.log.WarnContext(w.logCtx(r), "record dead-lettered", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
				"dead_letter_topic", topic, "reason", reason, "error", errText)
			if c.cfg.OnDeadLettered != nil {
				c.cfg.OnDeadLettered(r, reason)
			}
			return true
		}
		c.log.ErrorContext(w.logCtx(r), "dead-letter produce failed; retrying (the partition waits)", "dead_letter_topic", topic,
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "error", err)
		if !w.sleep(n) {
			return false
		}
	}
}

// deadLetterPoisoned dead-letters the poisoned message d and marks its inbox row, so that a
// redelivery is a duplicate rather than a second dead letter. If the mark fails, a later
// redelivery dead-letters the message again (the dead-letter topic is at least once).
func (w *partitionWorker) deadLetterPoisoned(r *kgo.Record, d *Delivery, reason string, res Result) bool {
	if !w.deadLetter(r, reason, res.Err, res.Attempts) {
		return false
	}
	ctx, cancel := context.WithTimeout(w.c.baseCtx, w.c.cfg.ShutdownTimeout)
	defer cancel()
	if err := w.c.store.markDeadLettered(ctx, w.c.pool, d.Event.Source, res.DedupeKey); err != nil {
		w.c.log.WarnContext(ctx, "could not record the dead letter in the inbox; a redelivery will dead-letter the message again",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "error", err)
	}
	return true
}
