package inbox

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
)

// plan is what decide makes of the records at the head of a batch: ds, the deliveries of
// recs[:len(ds)] in offset order, under the dedupe keys keys, go through the inbox; bad, when
// set, is why the record after them, recs[len(ds)], goes to the dead-letter topic without
// reaching it.
type plan struct {
	ds   []Delivery
	keys []string
	bad  *badRecord
}

// badRecord is why a record goes to the dead-letter topic without reaching the inbox.
type badRecord struct {
	reason string
	err    error
}

// decide decodes recs from the start up to the first record to dead-letter as it is, into
// a plan that reuses the arrays of prev's. ok=false means the worker stopped first (while a
// schema decoder was retried): no record of recs is done.
func (w *partitionWorker) decide(recs []*kgo.Record, prev plan) (p plan, ok bool) {
	p.ds, p.keys = prev.ds[:0], prev.keys[:0]
	for _, r := range recs {
		d, key, bad, ok := w.decode(r)
		switch {
		case !ok:
			return p, false
		case bad != nil:
			p.bad = bad
			return p, true
		}
		p.ds, p.keys = append(p.ds, d), append(p.keys, key)
	}
	return p, true
}

// decode decodes r into a delivery and computes its dedupe key. A non-nil bad means r must be
// dead-lettered; ok=false means the worker is stopping and r was abandoned.
func (w *partitionWorker) decode(r *kgo.Record) (d Delivery, key string, bad *badRecord, ok bool) {
	ev, err := envelope.Decode(toEnvelopeRecord(r))
	if err != nil {
		return d, "", &badRecord{ReasonDecode, err}, true
	}
	if dec := w.c.cfg.SchemaDecoder; dec != nil {
		for n := 0; ; n++ {
			err := dec(w.ctx, &ev)
			if err == nil {
				break
			}
			if IsPermanent(err) {
				return d, "", &badRecord{ReasonSchema, err}, true
			}
			w.warnRecord(r, "schema decoding failed; retrying", "error", err)
			if !w.sleep(n) {
				return d, "", nil, false
			}
		}
	}
	d = Delivery{Event: ev, Kafka: &KafkaRef{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}}
	key, err = w.c.store.DedupeKey(d)
	if err != nil {
		return d, "", &badRecord{ReasonDedupe, err}, true
	}
	return d, key, nil, true
}

func toEnvelopeRecord(r *kgo.Record) envelope.Record {
	hs := make([]envelope.Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = envelope.Header{Key: h.Key, Value: h.Value}
	}
	return envelope.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key,
		Value: r.Value, Headers: hs, Timestamp: r.Timestamp}
}
