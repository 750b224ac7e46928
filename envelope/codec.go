package envelope

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// EncodeOptions tunes [Event.AppendHeaders] and [Event.Record].
type EncodeOptions struct {
	// CloudEvents also emits the CloudEvents binary-mode headers (ce_id, ce_source, ce_type,
	// ce_specversion, ce_time, and ce_partitionkey when the event has a key) after the keiro
	// headers. The content-type header is shared by both profiles. Defaults to false.
	CloudEvents bool
}

// The CloudEvents binary-mode header names (Kafka protocol binding) this package emits and reads.
const (
	HeaderCEID           = "ce_id"
	HeaderCESource       = "ce_source"
	HeaderCEType         = "ce_type"
	HeaderCESpecVersion  = "ce_specversion"
	HeaderCETime         = "ce_time"
	HeaderCEPartitionKey = "ce_partitionkey"
)

// CloudEventsSpecVersion is the CloudEvents specification version emitted in ce_specversion.
const CloudEventsSpecVersion = "1.0"

// Headers returns the event's Kafka headers in keiro's emission order.
func (e *Event) Headers() []Header { return e.AppendHeaders(nil, EncodeOptions{}) }

// Record returns the Kafka record for the event: topic = Destination, key = Key (nil when the
// event has no key), value = Payload (not copied) and the headers of [Event.AppendHeaders].
// Timestamp is left zero so that the producer stamps the record.
func (e *Event) Record(opts EncodeOptions) Record {
	var key []byte
	if e.Key != nil {
		key = []byte(*e.Key)
	}
	return Record{
		Topic:   e.Destination,
		Key:     key,
		Value:   e.Payload,
		Headers: e.AppendHeaders(nil, opts),
	}
}

// AppendHeaders appends the event's Kafka headers to dst in keiro's emission order
// ([HeaderNames]): the six identity headers, content-type and keiro-occurred-at always, every
// other header only when its field is set. Integers are decimal, UUIDs lowercase hyphenated,
// keiro-occurred-at is ISO-8601 UTC with the fraction only when non-zero (as Haskell's
// iso8601Show), and keiro-attributes is compact JSON (kept verbatim when it is not valid
// JSON; [Event.Validate] reports that).
//
// All header values of one call share a single allocation; they must not be modified.
func (e *Event) AppendHeaders(dst []Header, opts EncodeOptions) []Header {
	// Values are appended to one buffer; the headers are sliced out of it at the end, once
	// the buffer can no longer move.
	type span struct {
		name       string
		start, end int
	}
	var spans [len(HeaderNames) + 6]span
	n := 0
	buf := make([]byte, 0, e.encodedSizeHint(opts))
	add := func(name string, start int) {
		spans[n] = span{name, start, len(buf)}
		n++
	}
	addString := func(name, v string) {
		start := len(buf)
		buf = append(buf, v...)
		add(name, start)
	}
	addInt := func(name string, v int64) {
		start := len(buf)
		buf = strconv.AppendInt(buf, v, 10)
		add(name, start)
	}
	addUUID := func(name string, u UUID) {
		start := len(buf)
		buf = u.appendText(buf)
		add(name, start)
	}

	addString(HeaderMessageID, e.MessageID)
	addString(HeaderSource, e.Source)
	addString(HeaderDestination, e.Destination)
	addString(HeaderEventType, e.EventType)
	addInt(HeaderSchemaVersion, e.SchemaVersion)
	addString(HeaderContentType, e.ContentType)
	if r := e.SchemaRef; r != nil {
		if r.Registry != nil {
			addString(HeaderSchemaRegistry, *r.Registry)
		}
		if r.Subject != nil {
			addString(HeaderSchemaSubject, *r.Subject)
		}
		if r.Version != nil {
			addInt(HeaderSchemaVersionRef, *r.Version)
		}
		if r.SchemaID != nil {
			addInt(HeaderSchemaID, *r.SchemaID)
		}
		if r.Fingerprint != nil {
			addString(HeaderSchemaFingerprint, *r.Fingerprint)
		}
	}
	if e.SourceEventID != nil {
		addUUID(HeaderSourceEventID, *e.SourceEventID)
	}
	if e.SourceGlobalPosition != nil {
		addInt(HeaderSourceGlobalPosition, *e.SourceGlobalPosition)
	}
	if e.CausationID != nil {
		addUUID(HeaderCausationID, *e.CausationID)
	}
	if e.CorrelationID != nil {
		addUUID(HeaderCorrelationID, *e.CorrelationID)
	}
	if tc := e.TraceContext; tc != nil {
		addString(HeaderTraceparent, tc.Traceparent)
		if tc.Tracestate != "" {
			addString(HeaderTracestate, tc.Tracestate)
		}
	}
	start := len(buf)
	buf = appendTime(buf, e.OccurredAt)
	add(HeaderOccurredAt, start)
	if len(e.Attributes) > 0 {
		start := len(buf)
		b := bytes.NewBuffer(buf)
		if err := json.Compact(b, e.Attributes); err == nil {
			buf = b.Bytes()
		} else {
			buf = append(buf[:start], e.Attributes...)
		}
		add(HeaderAttributes, start)
	}
	if opts.CloudEvents {
		addString(HeaderCEID, e.MessageID)
		addString(HeaderCESource, e.Source)
		addString(HeaderCEType, e.EventType)
		addString(HeaderCESpecVersion, CloudEventsSpecVersion)
		start := len(buf)
		buf = appendTime(buf, e.OccurredAt)
		add(HeaderCETime, start)
		if e.Key != nil {
			addString(HeaderCEPartitionKey, *e.Key)
		}
	}

	dst = growHeaders(dst, n)
	for _, s := range spans[:n] {
		dst = append(dst, Header{Key: s.name, Value: buf[s.start:s.end:s.end]})
	}
	return dst
}

func growHeaders(dst []Header, n int) []Header {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	grown := make([]Header, len(dst), len(dst)+n)
	copy(grown, dst)
	return grown
}

// encodedSizeHint is an upper-bound guess of the bytes the header values need.
func (e *Event) encodedSizeHint(opts EncodeOptions) int {
	n := len(e.MessageID) + len(e.Source) + len(e.Destination) + len(e.EventType) +
		len(e.ContentType) + 20 + len(time.RFC3339Nano) + len(e.Attributes)
	if r := e.SchemaRef; r != nil {
		n += 40
		if r.Registry != nil {
			n += len(*r.Registry)
		}
		if r.Subject != nil {
			n += len(*r.Subject)
		}
		if r.Fingerprint != nil {
			n += len(*r.Fingerprint)
		}
	}
	n += 3*36 + 20
	if tc := e.TraceContext; tc != nil {
		n += len(tc.Traceparent) + len(tc.Tracestate)
	}
	if opts.CloudEvents {
		n += len(e.MessageID) + len(e.Source) + len(e.EventType) + 3 + len(time.RFC3339Nano)
		if e.Key != nil {
			n += len(*e.Key)
		}
	}
	return n
}

// appendTime appends t in UTC as RFC 3339 with the fraction trimmed of trailing zeros and
// omitted when zero: byte-identical to Haskell's iso8601Show for UTCTime.
func appendTime(dst []byte, t time.Time) []byte {
	return t.UTC().AppendFormat(dst, time.RFC3339Nano)
}

// FormatTime formats t the way keiro-occurred-at carries it (ISO-8601 UTC, fraction only when
// non-zero, trailing zeros trimmed), for example "2023-02-25T00:00:00Z".
func FormatTime(t time.Time) string { return string(appendTime(nil, t)) }

// Decode decodes a consumed record into an Event, checking headers in keiro's order and
// returning the first problem as a *[HeaderError]:
//
//	keiro-source, keiro-destination, keiro-event-type, keiro-schema-version (presence, then
//	integer), content-type, keiro-message-id, keiro-schema-version-ref, keiro-schema-id,
//	keiro-source-event-id, keiro-source-global-position, keiro-causation-id,
//	keiro-correlation-id, keiro-occurred-at, keiro-attributes.
//
// Header lookups are exact and case-sensitive; the first header of a name wins. A record
// without keiro-source and keiro-message-id but with ce_* headers is decoded as a CloudEvents
// binary-mode record (see the package documentation).
//
// The event's Key is a copy of the record key (nil when the record has none); Payload aliases
// the record value. Header values are kept byte for byte (no UTF-8 check), except
// keiro-attributes, which is stored compacted.
func Decode(r Record) (Event, error) {
	h := new(headerIndex)
	h.index(r.Headers, r.Key)
	if !h.has(idxSource) && !h.has(idxMessageID) && h.hasCE {
		return decodeCloudEvents(r, h)
	}
	var e Event
	var err error
	if e.Source, err = h.required(idxSource); err != nil {
		return Event{}, err
	}
	if e.Destination, err = h.required(idxDestination); err != nil {
		return Event{}, err
	}
	if e.EventType, err = h.required(idxEventType); err != nil {
		return Event{}, err
	}
	if e.SchemaVersion, err = h.requiredInt(idxSchemaVersion); err != nil {
		return Event{}, err
	}
	if e.ContentType, err = h.required(idxContentType); err != nil {
		return Event{}, err
	}
	if e.MessageID, err = h.required(idxMessageID); err != nil {
		return Event{}, err
	}
	if err := h.decodeOptional(&e); err != nil {
		return Event{}, err
	}
	if e.OccurredAt, err = h.occurredAt(idxOccurredAt, r.Timestamp, false); err != nil {
		return Event{}, err
	}
	if e.Attributes, err = h.attributes(); err != nil {
		return Event{}, err
	}
	setKeyPayload(&e, r, h)
	return e, nil
}

// decodeCloudEvents maps a CloudEvents binary-mode record: ce_id → MessageID, ce_source →
// Source, ce_type → EventType, the topic → Destination (keiro-destination wins when present),
// keiro-schema-version when present else 0, ce_time → OccurredAt (else keiro-occurred-at,
// else the record timestamp). The optional keiro headers are read as in the keiro profile.
func decodeCloudEvents(r Record, h *headerIndex) (Event, error) {
	var e Event
	var err error
	if _, err = h.required(idxCESpecVersion); err != nil {
		return Event{}, err
	}
	if e.Source, err = h.required(idxCESource); err != nil {
		return Event{}, err
	}
	if h.has(idxDestination) {
		e.Destination = h.value(idxDestination)
	} else if r.Topic != "" {
		e.Destination = r.Topic
	} else {
		return Event{}, &HeaderError{Kind: MissingHeader, Header: HeaderDestination}
	}
	if e.EventType, err = h.required(idxCEType); err != nil {
		return Event{}, err
	}
	if h.has(idxSchemaVersion) {
		if e.SchemaVersion, err = h.requiredInt(idxSchemaVersion); err != nil {
			return Event{}, err
		}
	}
	if e.ContentType, err = h.required(idxContentType); err != nil {
		return Event{}, err
	}
	if e.MessageID, err = h.required(idxCEID); err != nil {
		return Event{}, err
	}
	if err := h.decodeOptional(&e); err != nil {
		return Event{}, err
	}
	if h.has(idxCETime) {
		e.OccurredAt, err = h.occurredAt(idxCETime, r.Timestamp, true)
	} else {
		e.OccurredAt, err = h.occurredAt(idxOccurredAt, r.Timestamp, false)
	}
	if err != nil {
		return Event{}, err
	}
	if e.Attributes, err = h.attributes(); err != nil {
		return Event{}, err
	}
	setKeyPayload(&e, r, h)
	return e, nil
}

// setKeyPayload sets the key (a copy, from the start of h.text) and the payload (aliased).
// It runs last, so the block decodeOptional may have allocated is reused.
func setKeyPayload(e *Event, r Record, h *headerIndex) {
	if r.Key != nil {
		blk := h.block()
		blk.key = h.text[:len(r.Key)]
		e.Key = &blk.key
	}
	e.Payload = r.Value
}

// Indexes into headerIndex.pos: the 19 keiro headers in HeaderNames order, then the ce_ ones.
const (
	idxMessageID = iota
	idxSource
	idxDestination
	idxEventType
	idxSchemaVersion
	idxContentType
	idxSchemaRegistry
	idxSchemaSubject
	idxSchemaVersionRef
	idxSchemaID
	idxSchemaFingerprint
	idxSourceEventID
	idxSourceGlobalPosition
	idxCausationID
	idxCorrelationID
	idxTraceparent
	idxTracestate
	idxOccurredAt
	idxAttributes
	idxCEID
	idxCESource
	idxCEType
	idxCESpecVersion
	idxCETime
	idxCount
)

var indexNames = [idxCount]string{
	HeaderMessageID, HeaderSource, HeaderDestination, HeaderEventType, HeaderSchemaVersion,
	HeaderContentType, HeaderSchemaRegistry, HeaderSchemaSubject, HeaderSchemaVersionRef,
	HeaderSchemaID, HeaderSchemaFingerprint, HeaderSourceEventID, HeaderSourceGlobalPosition,
	HeaderCausationID, HeaderCorrelationID, HeaderTraceparent, HeaderTracestate,
	HeaderOccurredAt, HeaderAttributes,
	HeaderCEID, HeaderCESource, HeaderCEType, HeaderCESpecVersion, HeaderCETime,
}

// headerIndex records the first header of each known name, found in one pass. The values of
// those headers are copied into one string (text) that the event's string fields slice, and
// the event's pointer fields point into one lazily allocated block, so that decoding costs a
// handful of allocations rather than one per field.
type headerIndex struct {
	hdrs  []Header
	pos   [idxCount]int32 // 1 + index into hdrs; 0 means absent
	off   [idxCount]int32 // start of the value in text
	text  string
	hasCE bool
	blk   *decodeBlock
}

// decodeBlock holds the values an Event points to.
type decodeBlock struct {
	ref                                 SchemaRef
	registry, subject, fingerprint, key string
	version, schemaID, position         int64
	sourceEventID, causation, corr      UUID
	trace                               TraceContext
}

func (h *headerIndex) index(hdrs []Header, key []byte) {
	h.hdrs = hdrs
	n := len(key)
	for i := range hdrs {
		k := hdrs[i].Key
		if len(k) > 3 && k[:3] == "ce_" {
			h.hasCE = true
		}
		j := headerSlot(k)
		if j >= 0 && h.pos[j] == 0 {
			h.pos[j] = int32(i + 1)
			n += len(hdrs[i].Value)
		}
	}
	var b strings.Builder
	b.Grow(n)
	b.Write(key)
	for j, p := range h.pos {
		if p != 0 {
			h.off[j] = int32(b.Len())
			b.Write(hdrs[p-1].Value)
		}
	}
	h.text = b.String()
}

func (h *headerIndex) block() *decodeBlock {
	if h.blk == nil {
		h.blk = new(decodeBlock)
	}
	return h.blk
}

func headerSlot(k string) int {
	switch k {
	case HeaderMessageID:
		return idxMessageID
	case HeaderSource:
		return idxSource
	case HeaderDestination:
		return idxDestination
	case HeaderEventType:
		return idxEventType
	case HeaderSchemaVersion:
		return idxSchemaVersion
	case HeaderContentType:
		return idxContentType
	case HeaderSchemaRegistry:
		return idxSchemaRegistry
	case HeaderSchemaSubject:
		return idxSchemaSubject
	case HeaderSchemaVersionRef:
		return idxSchemaVersionRef
	case HeaderSchemaID:
		return idxSchemaID
	case HeaderSchemaFingerprint:
		return idxSchemaFingerprint
	case HeaderSourceEventID:
		return idxSourceEventID
	case HeaderSourceGlobalPosition:
		return idxSourceGlobalPosition
	case HeaderCausationID:
		return idxCausationID
	case HeaderCorrelationID:
		return idxCorrelationID
	case HeaderTraceparent:
		return idxTraceparent
	case HeaderTracestate:
		return idxTracestate
	case HeaderOccurredAt:
		return idxOccurredAt
	case HeaderAttributes:
		return idxAttributes
	case HeaderCEID:
		return idxCEID
	case HeaderCESource:
		return idxCESource
	case HeaderCEType:
		return idxCEType
	case HeaderCESpecVersion:
		return idxCESpecVersion
	case HeaderCETime:
		return idxCETime
	}
	return -1
}

func (h *headerIndex) has(i int) bool { return h.pos[i] != 0 }

func (h *headerIndex) raw(i int) []byte { return h.hdrs[h.pos[i]-1].Value }

func (h *headerIndex) value(i int) string {
	start := int(h.off[i])
	return h.text[start : start+len(h.raw(i))]
}

func (h *headerIndex) required(i int) (string, error) {
	if !h.has(i) {
		return "", &HeaderError{Kind: MissingHeader, Header: indexNames[i]}
	}
	return h.value(i), nil
}

func (h *headerIndex) requiredInt(i int) (int64, error) {
	if !h.has(i) {
		return 0, &HeaderError{Kind: MissingHeader, Header: indexNames[i]}
	}
	return h.int(i)
}

func (h *headerIndex) int(i int) (int64, error) {
	v, ok := parseInt(h.raw(i))
	if !ok {
		return 0, newHeaderError(InvalidIntHeader, indexNames[i], h.raw(i))
	}
	return v, nil
}

func (h *headerIndex) optionalString(i int, dst *string) *string {
	if !h.has(i) {
		return nil
	}
	*dst = h.value(i)
	return dst
}

func (h *headerIndex) optionalInt(i int, dst *int64) (*int64, error) {
	if !h.has(i) {
		return nil, nil
	}
	v, err := h.int(i)
	if err != nil {
		return nil, err
	}
	*dst = v
	return dst, nil
}

func (h *headerIndex) optionalUUID(i int, dst *UUID) (*UUID, error) {
	if !h.has(i) {
		return nil, nil
	}
	u, err := ParseUUID(h.value(i))
	if err != nil {
		return nil, newHeaderError(InvalidUUIDHeader, indexNames[i], h.raw(i))
	}
	*dst = u
	return dst, nil
}

// decodeOptional reads the schema reference, the source event, causation, correlation and
// trace headers, in keiro's order.
func (h *headerIndex) decodeOptional(e *Event) error {
	var b decodeBlock // filled here, moved to the heap only when something is set
	var ref SchemaRef
	var err error
	ref.Registry = h.optionalString(idxSchemaRegistry, &b.registry)
	ref.Subject = h.optionalString(idxSchemaSubject, &b.subject)
	if ref.Version, err = h.optionalInt(idxSchemaVersionRef, &b.version); err != nil {
		return err
	}
	if ref.SchemaID, err = h.optionalInt(idxSchemaID, &b.schemaID); err != nil {
		return err
	}
	ref.Fingerprint = h.optionalString(idxSchemaFingerprint, &b.fingerprint)
	var sourceEventID, causation, correlation *UUID
	var position *int64
	if sourceEventID, err = h.optionalUUID(idxSourceEventID, &b.sourceEventID); err != nil {
		return err
	}
	if position, err = h.optionalInt(idxSourceGlobalPosition, &b.position); err != nil {
		return err
	}
	if causation, err = h.optionalUUID(idxCausationID, &b.causation); err != nil {
		return err
	}
	if correlation, err = h.optionalUUID(idxCorrelationID, &b.corr); err != nil {
		return err
	}
	hasTrace := h.has(idxTraceparent)
	if ref == (SchemaRef{}) && sourceEventID == nil && position == nil && causation == nil && correlation == nil && !hasTrace {
		return nil
	}
	blk := h.block()
	key := blk.key
	*blk = b
	blk.key = key
	pick := func(p *string, v *string) *string {
		if p == nil {
			return nil
		}
		return v
	}
	if ref != (SchemaRef{}) {
		blk.ref = SchemaRef{
			Registry:    pick(ref.Registry, &blk.registry),
			Subject:     pick(ref.Subject, &blk.subject),
			Fingerprint: pick(ref.Fingerprint, &blk.fingerprint),
		}
		if ref.Version != nil {
			blk.ref.Version = &blk.version
		}
		if ref.SchemaID != nil {
			blk.ref.SchemaID = &blk.schemaID
		}
		e.SchemaRef = &blk.ref
	}
	if sourceEventID != nil {
		e.SourceEventID = &blk.sourceEventID
	}
	if position != nil {
		e.SourceGlobalPosition = &blk.position
	}
	if causation != nil {
		e.CausationID = &blk.causation
	}
	if correlation != nil {
		e.CorrelationID = &blk.corr
	}
	if hasTrace {
		blk.trace = TraceContext{Traceparent: h.value(idxTraceparent)}
		if h.has(idxTracestate) {
			blk.trace.Tracestate = h.value(idxTracestate)
		}
		e.TraceContext = &blk.trace
	}
	return nil
}

func (h *headerIndex) occurredAt(i int, fallback time.Time, lenient bool) (time.Time, error) {
	if !h.has(i) {
		if fallback.IsZero() {
			return time.Time{}, nil
		}
		return fallback.UTC().Round(0), nil
	}
	t, ok := parseTime(h.raw(i), lenient)
	if !ok {
		return time.Time{}, newHeaderError(InvalidTimeHeader, indexNames[i], h.raw(i))
	}
	return t, nil
}

func (h *headerIndex) attributes() (json.RawMessage, error) {
	if !h.has(idxAttributes) {
		return nil, nil
	}
	raw := h.raw(idxAttributes)
	var b bytes.Buffer
	if !json.Valid(raw) || json.Compact(&b, raw) != nil {
		return nil, newHeaderError(InvalidJSONHeader, HeaderAttributes, raw)
	}
	return json.RawMessage(b.Bytes()), nil
}

// parseInt parses keiro's integer syntax: an optional sign, then one or more decimal digits,
// with nothing after. Values outside int64 are rejected (Haskell's Int would wrap silently).
func parseInt(b []byte) (int64, bool) {
	s := b
	neg := false
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if len(s) == 0 {
		return 0, false
	}
	var u uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		if u > (1<<63)/10 {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
		if u > 1<<63 {
			return 0, false
		}
	}
	if neg {
		return -int64(u), true // -(1<<63) wraps to itself: correct for MinInt64
	}
	if u > 1<<63-1 {
		return 0, false
	}
	return int64(u), true
}

// parseTime parses YYYY-MM-DDTHH:MM:SS[.F{1,12}](Z|±HH:MM) and returns it in UTC, the fraction
// truncated to nanoseconds. It accepts what keiro emits (iso8601Show: up to 12 fraction digits)
// and explicit offsets. lenient also accepts lowercase 't' and 'z' and any number of fraction
// digits (RFC 3339, for ce_time). Results outside years 0000–9999 are rejected so that every
// accepted time re-encodes.
func parseTime(b []byte, lenient bool) (time.Time, bool) {
	num := func(s []byte) (int, bool) {
		n := 0
		for _, c := range s {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	if len(b) < 20 || b[4] != '-' || b[7] != '-' || b[13] != ':' || b[16] != ':' {
		return time.Time{}, false
	}
	if b[10] != 'T' && !(lenient && b[10] == 't') {
		return time.Time{}, false
	}
	year, ok1 := num(b[0:4])
	month, ok2 := num(b[5:7])
	day, ok3 := num(b[8:10])
	hour, ok4 := num(b[11:13])
	minute, ok5 := num(b[14:16])
	sec, ok6 := num(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return time.Time{}, false
	}
	if month < 1 || month > 12 || day < 1 || day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	rest := b[19:]
	nsec := 0
	if len(rest) > 0 && rest[0] == '.' {
		digits := 0
		for digits+1 < len(rest) && rest[digits+1] >= '0' && rest[digits+1] <= '9' {
			if digits < 9 {
				nsec = nsec*10 + int(rest[digits+1]-'0')
			}
			digits++
		}
		if digits == 0 || (!lenient && digits > 12) {
			return time.Time{}, false
		}
		for i := digits; i < 9; i++ {
			nsec *= 10
		}
		rest = rest[1+digits:]
	}
	offset := 0
	switch {
	case len(rest) == 1 && (rest[0] == 'Z' || (lenient && rest[0] == 'z')):
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		oh, ok1 := num(rest[1:3])
		om, ok2 := num(rest[4:6])
		if !ok1 || !ok2 || oh > 23 || om > 59 {
			return time.Time{}, false
		}
		offset = oh*3600 + om*60
		if rest[0] == '-' {
			offset = -offset
		}
	default:
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC).
		Add(-time.Duration(offset) * time.Second)
	if t.Year() < 0 || t.Year() > 9999 {
		return time.Time{}, false
	}
	return t, true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// IsJSONContentType reports whether raw names JSON: the part before the first ';', trimmed
// of spaces and lowercased, equals "application/json" (keiro's parseContentType).
// "application/json; charset=utf-8" and "APPLICATION/JSON ; CHARSET=UTF-8" are JSON;
// "application/vnd.apache.avro+binary" and "application/problem+json" are not.
func IsJSONContentType(raw string) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] == ';' {
			raw = raw[:i]
			break
		}
	}
	raw = trimSpace(raw)
	const want = ContentTypeJSON
	if len(raw) != len(want) {
		return false
	}
	for i := 0; i < len(want); i++ {
		c := raw[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != want[i] {
			return false
		}
	}
	return true
}

// trimSpace trims what Haskell's Data.Text.strip removes: Data.Char.isSpace characters, that is
// space, tab, newline, vertical tab, form feed, carriage return, no-break space and the other
// Unicode space separators (category Zs).
func trimSpace(s string) string {
	return strings.TrimFunc(s, func(c rune) bool {
		return c == ' ' || (c >= '\t' && c <= '\r') || c == 0xa0 || (c > 0x377 && unicode.Is(unicode.Zs, c))
	})
}
