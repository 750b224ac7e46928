package console

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/console/internal/kafkaread"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// DeadLetterPage answers GET /api/v1/inbox/dead-letters: the records of the consumer's
// dead-letter topics, newest first.
type DeadLetterPage struct {
	// Topics are the dead-letter topics listed, with how many records each holds.
	Topics []DeadLetterTopic `json:"topics"`
	// Records are the page's records, newest first (by their Kafka timestamp).
	Records []DeadLetterRecord `json:"records"`
	// NextCursor continues the listing with older records (?cursor=); empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// AnyReplayable reports whether a record of the page can be replayed.
func (p DeadLetterPage) AnyReplayable() bool {
	for _, r := range p.Records {
		if r.Replayable {
			return true
		}
	}
	return false
}

// DeadLetterTopic is one dead-letter topic of the consumer.
type DeadLetterTopic struct {
	// Topic is the topic's name.
	Topic string `json:"topic"`
	// Records counts the records in the log (end offset minus start offset, per partition).
	Records int64 `json:"records"`
	// Error says why the topic could not be read (it does not exist until a first record is
	// dead-lettered, unless it was created beforehand).
	Error string `json:"error,omitempty"`
}

// DeadLetterRecord is one record of a dead-letter topic, with the reason the consumer gave.
type DeadLetterRecord struct {
	// Topic, Partition and Offset are the record's place in the dead-letter topic.
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Timestamp is the record's Kafka timestamp.
	Timestamp time.Time `json:"timestamp"`
	// Reason is the keiro-dlq-reason header: decode, schema, dedupe, poisoned, permanent or
	// unstorable (empty when the record has none).
	Reason string `json:"reason"`
	// Error is the keiro-dlq-error header: what failed.
	Error string `json:"error"`
	// Attempts is the keiro-dlq-attempts header: the handler's attempts (0 when it never ran).
	Attempts int `json:"attempts"`
	// Consumer is the inbox consumer name that dead-lettered the record.
	Consumer string `json:"consumer"`
	// DeadLetteredAt is the keiro-dlq-at header; null when absent or unreadable.
	DeadLetteredAt *time.Time `json:"dead_lettered_at"`
	// Original is where the record was read (keiro-dlq-topic, -partition, -offset): the topic a
	// replay writes it to. Null when the record carries no keiro-dlq-topic header.
	Original *KafkaPosition `json:"original"`
	// MessageID, EventType and Source are the record's keiro headers (empty when absent: a
	// record that failed to decode may lack them).
	MessageID string `json:"message_id"`
	EventType string `json:"event_type"`
	Source    string `json:"source"`
	// Key is the record's key as text (invalid UTF-8 replaced); null for a record without one.
	Key *string `json:"key"`
	// Headers are every header of the record, in order, the keiro-dlq-* ones included.
	Headers []Header `json:"headers"`
	// Payload is the record's value (a preview in lists).
	Payload Payload `json:"payload"`
	// Replayable reports whether a replay writes the record back to its source topic; when
	// false, NotReplayable says why and what to do instead.
	Replayable    bool   `json:"replayable"`
	NotReplayable string `json:"not_replayable,omitempty"`
}

// Path is the record's console path segment: topic/partition/offset.
func (d DeadLetterRecord) Path() string {
	return pathEscape(d.Topic) + "/" + strconv.Itoa(int(d.Partition)) + "/" + strconv.FormatInt(d.Offset, 10)
}

// Ref is the record's place as a replay names it.
func (d DeadLetterRecord) Ref() RecordRef {
	return RecordRef{Topic: d.Topic, Partition: d.Partition, Offset: d.Offset}
}

// RecordRef names one record of a dead-letter topic.
type RecordRef struct {
	// Topic is the dead-letter topic.
	Topic string `json:"topic"`
	// Partition is the record's partition.
	Partition int32 `json:"partition"`
	// Offset is the record's offset.
	Offset int64 `json:"offset"`
}

// Value is a reference as the replay form posts it: topic/partition/offset.
func (r RecordRef) Value() string {
	return r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
}

// parseRecordRef reads topic/partition/offset.
func parseRecordRef(s string) (RecordRef, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return RecordRef{}, fmt.Errorf("%q is not topic/partition/offset", s)
	}
	p, err1 := strconv.ParseInt(parts[1], 10, 32)
	o, err2 := strconv.ParseInt(parts[2], 10, 64)
	if parts[0] == "" || err1 != nil || err2 != nil || p < 0 || o < 0 {
		return RecordRef{}, fmt.Errorf("%q is not topic/partition/offset (a topic, then two whole numbers)", s)
	}
	return RecordRef{Topic: parts[0], Partition: int32(p), Offset: o}, nil
}

// notReplayableInInbox is why a poisoned or permanent record is not replayed.
const notReplayableInInbox = "the consumer stored this message in its inbox before dead-lettering it, so a replayed record would be skipped as already dead-lettered: retry it from the inbox (failed messages) once the handler is fixed"

// maxHeaderShown is the least of a header's value a list shows (the error header's 4 KiB).
const maxHeaderShown = 4 << 10

// deadLetterOf describes a dead-letter record; previewBytes bounds the payload shown, and the
// header values shown beyond maxHeaderShown.
func deadLetterOf(r *kgo.Record, previewBytes int) DeadLetterRecord {
	headerCap := max(previewBytes, maxHeaderShown) // a header's value shown, at most
	d := DeadLetterRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp.UTC(), Headers: []Header{}}
	var contentType string
	var origTopic, origPart, origOff string
	valueOmitted := false
	for _, h := range r.Headers {
		v := string(h.Value)
		shown := v
		if len(shown) > headerCap {
			shown = fmt.Sprintf("%s… (%d bytes)", shown[:headerCap], len(v))
		}
		d.Headers = append(d.Headers, Header{Key: h.Key, Value: strings.ToValidUTF8(shown, "\uFFFD")})
		switch h.Key {
		case inbox.HeaderDLQReason:
			d.Reason = v
		case inbox.HeaderDLQError:
			d.Error = strings.ToValidUTF8(shown, "\uFFFD")
		case inbox.HeaderDLQAttempts:
			d.Attempts, _ = strconv.Atoi(v)
		case inbox.HeaderDLQConsumer:
			d.Consumer = v
		case inbox.HeaderDLQAt:
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				d.DeadLetteredAt = &t
			}
		case inbox.HeaderDLQTopic:
			origTopic = v
		case inbox.HeaderDLQPartition:
			origPart = v
		case inbox.HeaderDLQOffset:
			origOff = v
		case inbox.HeaderDLQValueOmitted, inbox.HeaderDLQKeyOmitted, inbox.HeaderDLQHeadersOmitted:
			valueOmitted = true
		case envelope.HeaderMessageID:
			d.MessageID = strings.ToValidUTF8(v, "\uFFFD")
		case envelope.HeaderEventType:
			d.EventType = strings.ToValidUTF8(v, "\uFFFD")
		case envelope.HeaderSource:
			d.Source = strings.ToValidUTF8(v, "\uFFFD")
		case envelope.HeaderContentType:
			contentType = v
		}
	}
	if r.Key != nil {
		k := strings.ToValidUTF8(string(r.Key), "\uFFFD")
		d.Key = &k
	}
	if origTopic != "" {
		p, _ := strconv.ParseInt(origPart, 10, 32)
		o, _ := strconv.ParseInt(origOff, 10, 64)
		d.Original = &KafkaPosition{Topic: origTopic, Partition: int32(p), Offset: o}
	}
	v := r.Value
	d.Payload = newPayload(v[:min(len(v), previewBytes)], len(v), contentType)
	switch {
	case d.Original == nil:
		d.NotReplayable = "the record has no " + inbox.HeaderDLQTopic + " header: it was not dead-lettered by a keiro consumer, and its source topic is unknown"
	case envelope.ValidateTopic(d.Original.Topic) != nil:
		d.NotReplayable = fmt.Sprintf("its %s header %q is not a valid topic name", inbox.HeaderDLQTopic, d.Original.Topic)
	case d.Reason == inbox.ReasonPoisoned || d.Reason == inbox.ReasonPermanent:
		d.NotReplayable = notReplayableInInbox
	case valueOmitted:
		d.NotReplayable = fmt.Sprintf("the dead letter was too large for Kafka and carries no value (%s): the original is at %s partition %d offset %d until the topic's retention removes it; reset the group's offset there or produce it again",
			inbox.HeaderDLQValueOmitted, d.Original.Topic, d.Original.Partition, d.Original.Offset)
	default:
		d.Replayable = true
	}
	return d
}

// deadLetterOf is deadLetterOf with the console's replay targets: a record whose source topic
// (keiro-dlq-topic) the consumer does not read is not replayable, whatever else it is.
func (c *Console) deadLetterOf(r *kgo.Record, previewBytes int) DeadLetterRecord {
	d := deadLetterOf(r, previewBytes)
	if d.Replayable && !c.consumes(d.Original.Topic) {
		d.Replayable = false
		d.NotReplayable = fmt.Sprintf("its %s header names %q, which is not a topic this consumer reads (%s): a replay writes only to those",
			inbox.HeaderDLQTopic, d.Original.Topic, strings.Join(c.cfg.Inbox.Topics, ", "))
	}
	return d
}

// consumes reports whether the consumer reads topic (InboxConfig.Topics and TopicsRegex).
func (c *Console) consumes(topic string) bool {
	for _, t := range c.cfg.Inbox.Topics {
		if !c.cfg.Inbox.TopicsRegex {
			if t == topic {
				return true
			}
			continue
		}
		if re, err := regexp.Compile(t); err == nil && re.MatchString(topic) {
			return true
		}
	}
	return false
}

// dlqCursor is, per dead-letter topic and partition, the offset before which a listing
// continues.
type dlqCursor map[string]map[int32]int64

func (cur dlqCursor) encode() string {
	b, _ := json.Marshal(cur)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeDLQCursor(s string) (dlqCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	var cur dlqCursor
	if err == nil {
		err = json.Unmarshal(b, &cur)
	}
	if err != nil || len(cur) == 0 {
		return nil, fmt.Errorf("cursor %q is not one this API returned: start again without it", s)
	}
	return cur, nil
}

// errNoDeadLetterTopics reports a dead-letter request on a console that names none.
var errNoDeadLetterTopics = errors.New("this console reads no dead-letter topic (InboxConfig.DeadLetterTopics and Kafka; the consumer binary sets them from --dlq-topic)")

// needDeadLetters answers 404 when no dead-letter topic is configured.
func (c *Console) needDeadLetters(h http.HandlerFunc) http.HandlerFunc {
	return c.needInbox(func(w http.ResponseWriter, r *http.Request) {
		if len(c.cfg.Inbox.DeadLetterTopics) == 0 {
			c.fail(w, r, strings.HasPrefix(r.URL.Path, "/api/"), http.StatusNotFound, errNoDeadLetterTopics.Error())
			return
		}
		h(w, r)
	})
}

// checkDeadLetterTopic refuses a topic that is not one of the consumer's dead-letter topics.
func (c *Console) checkDeadLetterTopic(topic string) error {
	if !slices.Contains(c.cfg.Inbox.DeadLetterTopics, topic) {
		return fmt.Errorf("%q is not a dead-letter topic of this consumer (it reads %s)", topic, strings.Join(c.cfg.Inbox.DeadLetterTopics, ", "))
	}
	return nil
}

// listDeadLetters reads a page of dead-letter records, newest first: per partition the newest
// records before the cursor, merged by timestamp.
func (c *Console) listDeadLetters(ctx context.Context, r *http.Request) (DeadLetterPage, error) {
	q := r.URL.Query()
	limit, err := pageSize(r)
	if err != nil {
		return DeadLetterPage{}, badRequest{err}
	}
	topics := c.cfg.Inbox.DeadLetterTopics
	if t := strings.TrimSpace(q.Get("topic")); t != "" {
		if err := c.checkDeadLetterTopic(t); err != nil {
			return DeadLetterPage{}, badRequest{err}
		}
		topics = []string{t}
	}
	var cur dlqCursor
	if s := q.Get("cursor"); s != "" {
		if cur, err = decodeDLQCursor(s); err != nil {
			return DeadLetterPage{}, badRequest{err}
		}
	}
	cl := c.cfg.Inbox.Kafka
	bounds, err := kafkaread.Partitions(ctx, cl, topics...)
	if err != nil {
		return DeadLetterPage{}, err
	}
	page := DeadLetterPage{Topics: []DeadLetterTopic{}, Records: []DeadLetterRecord{}}
	var parts []*dlqPart
	for _, t := range topics {
		dt := DeadLetterTopic{Topic: t}
		if b, ok := bounds[t][-1]; ok {
			dt.Error = fmt.Sprintf("%v (the topic is created by the first dead letter)", b.Err)
			page.Topics = append(page.Topics, dt)
			continue
		}
		for p, b := range bounds[t] {
			if b.Err != nil {
				dt.Error = fmt.Sprintf("partition %d: %v", p, b.Err)
				continue
			}
			dt.Records += b.End - b.Start
			before := b.End
			if cur != nil {
				var ok bool
				if before, ok = cur[t][p]; !ok {
					continue // a partition the listing had no records of when it began
				}
				before = min(before, b.End)
			}
			parts = append(parts, &dlqPart{topic: t, partition: p, start: b.Start, before: before, readFrom: before})
		}
		page.Topics = append(page.Topics, dt)
	}
	slices.SortFunc(parts, func(a, b *dlqPart) int {
		if a.topic != b.topic {
			return strings.Compare(a.topic, b.topic)
		}
		return int(a.partition - b.partition)
	})
	rd := &dlqReader{c: c, ctx: ctx}
	// The newest record of every partition: the merge needs each partition's head.
	for _, p := range parts {
		if err := rd.fill(p, 1); err != nil {
			return page, err
		}
	}
	// Merge: take the newest of the partitions' heads until the page is full. A partition
	// whose fetched records ran out is read further (twice as many each time) while the
	// page's byte budget lasts; past it the page ends, and the cursor continues it.
	for len(page.Records) < limit {
		var best *dlqPart
		for _, p := range parts {
			if len(p.recs) == 0 {
				continue
			}
			if best == nil || p.recs[len(p.recs)-1].Timestamp.After(best.recs[len(best.recs)-1].Timestamp) {
				best = p
			}
		}
		if best == nil {
			break
		}
		d := best.recs[len(best.recs)-1]
		best.recs, best.before = best.recs[:len(best.recs)-1], d.Offset
		page.Records = append(page.Records, d)
		if len(best.recs) == 0 && best.readFrom > best.start && len(page.Records) < limit {
			if rd.spent >= DeadLetterPageBytes {
				break
			}
			best.window = min(2*max(best.window, 1), int64(limit-len(page.Records)))
			if err := rd.fill(best, best.window); err != nil {
				if errors.Is(err, kafkaread.ErrBudget) {
					break
				}
				return page, err
			}
		}
	}
	next := dlqCursor{}
	more := false
	for _, p := range parts {
		if len(p.recs) > 0 || p.readFrom > p.start {
			more = true
		}
		if next[p.topic] == nil {
			next[p.topic] = map[int32]int64{}
		}
		next[p.topic][p.partition] = p.before
	}
	if more {
		page.NextCursor = next.encode()
	}
	return page, nil
}

// dlqPart is one partition of a dead-letter listing: the records read and not yet listed.
type dlqPart struct {
	topic     string
	partition int32
	start     int64 // the log start offset
	before    int64 // the listing continues before this offset (the cursor)
	readFrom  int64 // the oldest offset read
	window    int64 // how many offsets the last read covered
	recs      []DeadLetterRecord
}

// dlqReader reads the partitions of one dead-letter page within DeadLetterPageBytes.
type dlqReader struct {
	c     *Console
	ctx   context.Context
	spent int
}

// fill reads up to n offsets of p below the ones already read, as list entries (values cut
// to their preview), skipping offsets without a record; a read stopped by the page's byte
// budget returns kafkaread.ErrBudget and keeps nothing of it.
func (rd *dlqReader) fill(p *dlqPart, n int64) error {
	for len(p.recs) == 0 && p.readFrom > p.start {
		from := max(p.start, p.readFrom-n)
		opts := kafkaread.Options{MaxBytes: dlqFetchBytes, Fetched: func(b int) {
			rd.spent += b
			if rd.c.fetched != nil {
				rd.c.fetched(b)
			}
		}}
		if n > 1 {
			opts.MaxTotalBytes = max(DeadLetterPageBytes-rd.spent, 1)
		}
		recs, err := kafkaread.Range(rd.ctx, rd.c.cfg.Inbox.Kafka, p.topic, p.partition, from, p.readFrom, opts)
		if err != nil {
			return err
		}
		for _, r := range recs {
			p.recs = append(p.recs, rd.c.deadLetterOf(r, DefaultPreviewBytes))
		}
		p.readFrom, p.window = from, n
		n *= 2
	}
	return nil
}

// readDeadLetter reads one dead-letter record.
func (c *Console) readDeadLetter(ctx context.Context, ref RecordRef) (*kgo.Record, error) {
	if err := c.checkDeadLetterTopic(ref.Topic); err != nil {
		return nil, badRequest{err}
	}
	// One batch: the one holding the record (a dead letter is produced alone).
	recs, err := kafkaread.Range(ctx, c.cfg.Inbox.Kafka, ref.Topic, ref.Partition, ref.Offset, ref.Offset+1,
		kafkaread.Options{MaxBytes: 1, Fetched: c.fetched})
	if errors.Is(err, kafkaread.ErrNoPartition) {
		return nil, errDeadLetterNotFound{ref}
	}
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 || recs[0].Offset != ref.Offset {
		return nil, errDeadLetterNotFound{ref}
	}
	return recs[0], nil
}

// errDeadLetterNotFound reports an offset with no record (answered 404).
type errDeadLetterNotFound struct{ ref RecordRef }

func (e errDeadLetterNotFound) Error() string {
	return fmt.Sprintf("no record at %s partition %d offset %d (no such partition, past the end, or removed by retention or compaction)", e.ref.Topic, e.ref.Partition, e.ref.Offset)
}

// ReplayRequest is the body of POST /api/v1/inbox/dead-letters/replay.
type ReplayRequest struct {
	// Records are the dead-letter records to write back to their source topic; at most
	// MaxSelection.
	Records []RecordRef `json:"records"`
}

func (q ReplayRequest) validate() error {
	var errs []error
	if len(q.Records) == 0 {
		errs = append(errs, errors.New("name the records to replay (topic, partition and offset of each)"))
	}
	if len(q.Records) > MaxSelection {
		errs = append(errs, fmt.Errorf("at most %d records per request, got %d", MaxSelection, len(q.Records)))
	}
	for i, r := range q.Records {
		if r.Topic == "" || r.Partition < 0 || r.Offset < 0 {
			errs = append(errs, fmt.Errorf("records[%d]: topic is required, partition and offset are not negative", i))
		}
	}
	return errors.Join(errs...)
}

// ReplayAnswer answers a replay: each record written back, or skipped with the reason.
type ReplayAnswer struct {
	// Replayed are the records written to their source topic, in request order.
	Replayed []ReplayedRecord `json:"replayed"`
	// Skipped are the records not written, with the reason.
	Skipped []SkippedRecord `json:"skipped"`
}

// ReplayedRecord is a dead-letter record and the copy a replay wrote.
type ReplayedRecord struct {
	// From is the dead-letter record.
	From RecordRef `json:"from"`
	// To is where the copy landed in the source topic.
	To KafkaPosition `json:"to"`
}

// SkippedRecord is a record a replay did not write.
type SkippedRecord struct {
	// Record names the dead-letter record.
	Record RecordRef `json:"record"`
	// Reason says why.
	Reason string `json:"reason"`
}

// replayDeadLetters writes each named record back to its source topic (keiro-dlq-topic), when
// the consumer reads it, with its key, value and headers minus keiro-dlq-* (a new timestamp),
// and logs who replayed what. Each record is read alone (one batch); the copies are produced in
// request order, DeadLetterPageBytes at a time, so records of one key keep their order.
func (c *Console) replayDeadLetters(r *http.Request, q ReplayRequest) (ReplayAnswer, error) {
	ctx := r.Context()
	ans := ReplayAnswer{Replayed: []ReplayedRecord{}, Skipped: []SkippedRecord{}}
	var out []*kgo.Record
	var from []RecordRef
	held := 0
	// flush produces the copies held, in order, so that a replay of many large records holds
	// at most DeadLetterPageBytes of them at a time.
	flush := func() {
		if len(out) == 0 {
			return
		}
		res := c.cfg.Inbox.Kafka.ProduceSync(ctx, out...)
		for i, pr := range res {
			if pr.Err != nil {
				ans.Skipped = append(ans.Skipped, SkippedRecord{Record: from[i], Reason: "produce to " + out[i].Topic + ": " + pr.Err.Error()})
				continue
			}
			ans.Replayed = append(ans.Replayed, ReplayedRecord{From: from[i],
				To: KafkaPosition{Topic: pr.Record.Topic, Partition: pr.Record.Partition, Offset: pr.Record.Offset}})
		}
		out, from, held = out[:0], from[:0], 0
	}
	for _, ref := range q.Records {
		rec, err := c.readDeadLetter(ctx, ref)
		var nf errDeadLetterNotFound
		var bad badRequest
		switch {
		case errors.As(err, &nf), errors.As(err, &bad):
			ans.Skipped = append(ans.Skipped, SkippedRecord{Record: ref, Reason: err.Error()})
			continue
		case err != nil:
			return ans, err
		}
		d := c.deadLetterOf(rec, 0)
		if !d.Replayable {
			ans.Skipped = append(ans.Skipped, SkippedRecord{Record: ref, Reason: d.NotReplayable})
			continue
		}
		cp := &kgo.Record{Topic: d.Original.Topic, Key: rec.Key, Value: rec.Value}
		for _, h := range rec.Headers {
			if !strings.HasPrefix(h.Key, "keiro-dlq-") {
				cp.Headers = append(cp.Headers, h)
			}
		}
		out = append(out, cp)
		from = append(from, ref)
		held += len(cp.Key) + len(cp.Value)
		for _, h := range cp.Headers {
			held += len(h.Key) + len(h.Value)
		}
		if held >= DeadLetterPageBytes {
			flush()
		}
	}
	flush()
	c.action(r, "dead-letter replay", "consumer", c.cfg.Inbox.Consumer, "records", len(q.Records),
		"replayed", len(ans.Replayed), "skipped", len(ans.Skipped))
	return ans, nil
}

func (c *Console) apiDeadLetters(w http.ResponseWriter, r *http.Request) {
	page, err := c.listDeadLetters(r.Context(), r)
	var bad badRequest
	switch {
	case errors.As(err, &bad):
		writeError(w, http.StatusBadRequest, bad.Error())
	case err != nil:
		c.serverError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, page)
	}
}

// pathRecordRef reads {topic}/{partition}/{offset} of a path.
func pathRecordRef(r *http.Request) (RecordRef, error) {
	return parseRecordRef(r.PathValue("topic") + "/" + r.PathValue("partition") + "/" + r.PathValue("offset"))
}

func (c *Console) apiDeadLetter(w http.ResponseWriter, r *http.Request) {
	ref, err := pathRecordRef(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rec, err := c.readDeadLetter(r.Context(), ref)
	var nf errDeadLetterNotFound
	var bad badRequest
	switch {
	case errors.As(err, &bad):
		writeError(w, http.StatusBadRequest, bad.Error())
	case errors.As(err, &nf):
		writeError(w, http.StatusNotFound, nf.Error())
	case err != nil:
		c.serverError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, c.deadLetterOf(rec, DefaultDetailPayloadBytes))
	}
}
