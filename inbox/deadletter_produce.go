package inbox

import (
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/internal/kafkaerr"
)

// A worker's produce of a record to the dead-letter topic (the headers and reasons it sets
// are in deadletter.go).
//
// A failed produce is classified once (internal/kafkaerr):
//   - Kafka refuses the dead letter itself (too large for the client's ProducerBatchMaxBytes,
//     checked before producing, or for the broker: MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE,
//     INVALID_RECORD): it would be refused again, so a smaller dead letter goes instead, at
//     once (see dlqShape); nothing is lost, since the original stays addressable at its topic,
//     partition and offset;
//   - anything else (the dead-letter topic missing or not writable, Kafka unavailable) fails
//     every dead letter alike: an outage of the sink, retried with backoff while the partition
//     waits, shown by the keiro.inbox.deadletter.blocked gauge and an error line.

// maxDLQErrorLen bounds the error text a dead letter carries (HeaderDLQError).
const maxDLQErrorLen = 4 << 10

// shortDLQErrorLen bounds the error text of a dead letter sent again smaller (dlqShort).
const shortDLQErrorLen = 256

// defaultBatchMaxBytes is franz-go's default ProducerBatchMaxBytes.
const defaultBatchMaxBytes = kafkaerr.DefaultMaxRecordBytes

// dlqShape is how much of the original record a dead letter carries, from the whole record
// down to its coordinates: each shape is tried when Kafka refused the previous one as too large
// or invalid.
type dlqShape int

const (
	// dlqWhole: the original key, value and headers, the error text up to maxDLQErrorLen.
	dlqWhole dlqShape = iota
	// dlqShort: dlqWhole with the error text cut to shortDLQErrorLen.
	dlqShort
	// dlqNoValue: dlqShort without the value (HeaderDLQValueOmitted has its size).
	dlqNoValue
	// dlqBare: dlqNoValue without the key and the original headers either (HeaderDLQKeyOmitted
	// and HeaderDLQHeadersOmitted say so): only the keiro-dlq-* headers.
	dlqBare
)

// deadLetter produces r to the dead-letter topic and waits for the acknowledgement; it never
// drops. false means the worker stopped first (r is not committed and will be redelivered).
func (w *partitionWorker) deadLetter(r *kgo.Record, reason string, cause error, attempts int) bool {
	errText := ""
	if cause != nil {
		errText = truncate(cause.Error(), maxDLQErrorLen)
	}
	c := w.c
	topic := c.deadLetterTopic(r.Topic)
	limit := w.maxRecordBytes(topic)
	blocked := false
	defer func() {
		if blocked {
			c.dlqBlocked.Add(-1)
			w.track.deadLetterBlocked(nil)
		}
	}()
	shape := dlqWhole
	for n := 0; ; {
		// The first shape from here that the client accepts: a record it would refuse for its
		// size costs no round trip.
		out := dlqRecord(r, topic, shape, reason, errText, attempts, c.cfg.Store.Consumer)
		for shape < dlqBare && (out == nil || recordSize(out) > limit) {
			shape++
			out = dlqRecord(r, topic, shape, reason, errText, attempts, c.cfg.Store.Consumer)
		}
		err := w.cl.ProduceSync(w.ctx, out).FirstErr()
		if err == nil {
			w.deadLettered(r, out, shape, reason, errText, limit)
			return true
		}
		if w.ctx.Err() != nil {
			return false
		}
		if code, ok := kafkaerr.RecordRefusal(err); ok && shape < dlqBare {
			c.log.WarnContext(w.logCtx(r), "Kafka refused the dead letter; sending a smaller one",
				"dead_letter_topic", topic, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
				"code", code, "error", err)
			shape++
			continue
		}
		if !blocked {
			blocked = true
			c.dlqBlocked.Add(1)
		}
		w.track.deadLetterBlocked(err)
		c.in.deadLetterFailed(w.ctx, c.cfg.Store.Consumer, kafkaerr.Code(err))
		c.log.ErrorContext(w.logCtx(r), "dead-letter produce failed; retrying (the partition waits): "+sinkAdvice(err, topic),
			"dead_letter_topic", topic, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "error", err)
		if !w.sleep(n) {
			return false
		}
		n++
	}
}

// deadLettered counts and logs r's dead letter out, produced in shape.
func (w *partitionWorker) deadLettered(r, out *kgo.Record, shape dlqShape, reason, errText string, limit int) {
	c := w.c
	c.deadLettered.Add(1)
	c.in.deadlettered.Add(w.ctx, 1, c.in.messageAttrs(c.cfg.Store.Consumer, r.Topic))
	if shape >= dlqNoValue {
		c.dlqValueOmitted.Add(1)
		c.in.dlqOmitted.Add(w.ctx, 1, c.in.messageAttrs(c.cfg.Store.Consumer, r.Topic))
		c.log.ErrorContext(w.logCtx(r), "record dead-lettered WITHOUT its value: the dead letter would be too large for Kafka; "+
			"read the original at its topic, partition and offset before the topic's retention removes it",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "dead_letter_topic", out.Topic,
			"value_bytes", len(r.Value), "key_omitted", shape == dlqBare, "max_record_bytes", limit,
			"reason", reason, "error", errText)
	} else {
		w.warnRecord(r, "record dead-lettered", "dead_letter_topic", out.Topic, "reason", reason, "error", errText)
	}
	if c.cfg.OnDeadLettered != nil {
		c.cfg.OnDeadLettered(r, reason)
	}
}

// dlqRecord is r's dead letter in shape, or nil when shape would carry the same as the shape
// before it (an error text already short).
func dlqRecord(r *kgo.Record, topic string, shape dlqShape, reason, errText string, attempts int, consumer string) *kgo.Record {
	if shape == dlqShort {
		if len(errText) <= shortDLQErrorLen {
			return nil
		}
	}
	if shape >= dlqShort {
		errText = truncate(errText, shortDLQErrorLen)
	}
	out := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value}
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+11)
	if shape < dlqBare {
		headers = append(headers, r.Headers...)
	}
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDLQError, Value: []byte(errText)},
		kgo.RecordHeader{Key: HeaderDLQAttempts, Value: []byte(strconv.Itoa(attempts))},
		kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		kgo.RecordHeader{Key: HeaderDLQConsumer, Value: []byte(consumer)},
		kgo.RecordHeader{Key: HeaderDLQAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	)
	if shape >= dlqNoValue {
		out.Value = nil
		headers = append(headers, kgo.RecordHeader{Key: HeaderDLQValueOmitted, Value: []byte(strconv.Itoa(len(r.Value)))})
	}
	if shape == dlqBare {
		out.Key = nil
		headers = append(headers,
			kgo.RecordHeader{Key: HeaderDLQKeyOmitted, Value: []byte(strconv.Itoa(len(r.Key)))},
			kgo.RecordHeader{Key: HeaderDLQHeadersOmitted, Value: []byte(strconv.Itoa(len(r.Headers)))})
	}
	out.Headers = headers
	return out
}

// maxRecordBytes is the largest dead letter the client sends to topic: its
// ProducerBatchMaxBytes (and MaxBufferedBytes, past which it refuses a record too).
func (w *partitionWorker) maxRecordBytes(topic string) int {
	limit := defaultBatchMaxBytes
	if fn, ok := w.cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32); ok && fn != nil {
		limit = int(fn(topic))
	}
	if n, ok := w.cl.OptValue(kgo.MaxBufferedBytes).(int64); ok && n > 0 && int(n) < limit {
		limit = int(n)
	}
	return limit
}

// recordSize bounds the bytes rec takes in a record batch of its own: the batch header, the
// record's framing (its varints at their widest), the key, the value and the headers.
func recordSize(rec *kgo.Record) int {
	n := 61 + 21 + len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

// sinkAdvice says what an operator does about a dead-letter produce that failed with err.
func sinkAdvice(err error, topic string) string {
	code, _ := kafkaerr.TopicRefusal(err)
	switch code {
	case "unknown_topic_or_partition", "unknown_topic_id":
		return fmt.Sprintf("the dead-letter topic %s does not exist: create the topic (or fix --dlq-topic / DeadLetterTopic)", topic)
	case "topic_authorization_failed", "cluster_authorization_failed":
		return fmt.Sprintf("the consumer may not write the dead-letter topic %s: grant its principal WRITE (and DESCRIBE) on the topic", topic)
	}
	if _, ok := kafkaerr.RecordRefusal(err); ok {
		return fmt.Sprintf("Kafka refuses even a dead letter without key, value or original headers: raise max.message.bytes of %s", topic)
	}
	return "Kafka or the path to it is unavailable; the produce is retried until it succeeds"
}

// truncate cuts s to at most n bytes.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
