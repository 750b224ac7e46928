package inbox

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/internal/adminq"
	"github.com/keiro-go/keiro/internal/pgtext"
)

// envelopeColumns are the per-row columns bound from a Delivery, in the order of
// rowColumns.args and of the unnest(...) list in the statements below.
const envelopeColumns = `source, dedupe_key, message_id, message_key, source_event_id,
	source_global_position, destination, event_type, schema_version, content_type,
	schema_registry, schema_subject, schema_version_ref, schema_id, schema_fingerprint,
	causation_id, correlation_id, traceparent, tracestate, kafka_topic, kafka_partition,
	kafka_offset, payload_bytes, attributes, occurred_at`

const unnestRows = `unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::uuid[], $7::int8[],
	$8::text[], $9::text[], $10::int8[], $11::text[], $12::text[], $13::text[], $14::int8[],
	$15::int8[], $16::text[], $17::uuid[], $18::uuid[], $19::text[], $20::text[], $21::text[],
	$22::int4[], $23::int8[], $24::bytea[], $25::text[], $26::timestamptz[]) AS r(` + envelopeColumns + `)`

const selectRow = `$1, r.source, r.dedupe_key, r.message_id, r.message_key, r.source_event_id,
	r.source_global_position, r.destination, r.event_type, r.schema_version, r.content_type,
	r.schema_registry, r.schema_subject, r.schema_version_ref, r.schema_id, r.schema_fingerprint,
	r.causation_id, r.correlation_id, r.traceparent, r.tracestate, r.kafka_topic, r.kafka_partition,
	r.kafka_offset, r.payload_bytes, r.attributes::jsonb, r.occurred_at`

// existingColumns are the columns of an existing row (existingRow), in its scan order.
const existingColumns = `i.source, i.dedupe_key, i.status, i.attempt_count, i.poisoned,
	coalesce(i.last_error, ''), i.dead_lettered_at IS NOT NULL`

// statements holds the SQL of one Store, with its validated schema name substituted.
type statements struct {
	insertCompleted string
	recordFailure   string
	readExisting    string
	lockExisting    string
	markCompleted   string
	markFailed      string
	markCompletedDO string
	lookup          string
	listFailed      string
	archive         string
	attemptErrors   string
	search          string
	retryKeys       string
	retryAll        string
	deleteCompleted string
	countFailed     string
	countByConsumer string
	// countByConsumerUnarchived is countByConsumer before migration 011; hasArchive tells which applies.
	countByConsumerUnarchived, hasArchive string
	activity                              string
	markDeadLettered                      string
	failureGroups                         string
	failureGroupKeys                      string
}

// failureRows are the store consumer's ($1) failed rows not archived, grouped by error class
// (poisoned or retrying) and normalised last error (adminq), oldest failure first within a
// group, in the inbox table {{table}}.
var failureRows = adminq.Table{
	Rows:   `{{table}} WHERE consumer = $1 AND status = 'failed' AND archived_at IS NULL`,
	Params: 1,
	Class:  `CASE WHEN poisoned THEN 'poisoned' ELSE 'retrying' END`,
	At:     "failed_at", Where: "source", Key: "source, dedupe_key", Order: "at, source, dedupe_key",
}

func newStatements(schema string) statements {
	t := schema + ".keiro_inbox"
	const storedCols = `consumer, ` + envelopeColumns
	// entry is an Entry's columns in scanEntry's order, payload reading the payload
	// (payload_bytes, or a prefix of it in the listings) followed by its whole size.
	entry := func(payload string) string {
		return strings.Replace(envelopeColumns, "payload_bytes", payload+", octet_length(payload_bytes)", 1) +
			`, received_at, status, attempt_count, poisoned, completed_at, failed_at, coalesce(last_error, '')`
	}
	// x fills the table's name (pgtext.Expand).
	x := func(q string) string { return pgtext.Expand(q, "table", t) }
	return statements{
		failureGroups:    x(failureRows.GroupsSQL()),
		failureGroupKeys: x(failureRows.KeysSQL()),
		// insert-first: the dedupe row, completed, inserted before the handler runs in the same
		// transaction. A concurrent insert of the same key blocks on the primary key until the
		// first transaction ends.
		insertCompleted: x(`INSERT INTO {{table}} (` + storedCols + `, status, attempt_count, completed_at)
SELECT ` + selectRow + `, 'completed', 0, now()
FROM ` + unnestRows + `
ON CONFLICT (consumer, source, dedupe_key) DO NOTHING
RETURNING source, dedupe_key`),
		// A failed attempt, in its own transaction after the handler's rolled back. Never flips a
		// row that another process completed meanwhile (WHERE status = 'failed'). The attempt
		// joins the row's history (attempt_errors, the last 20).
		recordFailure: x(`INSERT INTO {{table}} (` + storedCols + `, status, attempt_count, poisoned, failed_at, last_error, attempt_errors)
SELECT ` + selectRow + `, 'failed', 1, $28 OR 1 >= $29, now(), $27,
    jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'error', left($27, 1024)))
FROM ` + unnestRows + `
ON CONFLICT (consumer, source, dedupe_key) DO UPDATE
SET attempt_count = keiro_inbox.attempt_count + 1,
    poisoned = keiro_inbox.poisoned OR $28 OR keiro_inbox.attempt_count + 1 >= $29,
    failed_at = now(),
    last_error = EXCLUDED.last_error,
    attempt_errors = jsonb_path_query_array(coalesce(keiro_inbox.attempt_errors, '[]'::jsonb) || jsonb_build_array(
        jsonb_build_object('attempt', keiro_inbox.attempt_count + 1, 'at', now(), 'error', left(EXCLUDED.last_error, 1024))),
        '$[last - 19 to last]')
WHERE keiro_inbox.status = 'failed'
RETURNING attempt_count, poisoned`),
		// attemptErrors reads a row's failed attempts (Admin.AttemptHistory).
		attemptErrors: x(`SELECT attempt_errors FROM {{table}} WHERE consumer = $1 AND source = $2 AND dedupe_key = $3`),
		// The rows that earlier deliveries of $2/$3 recorded (existing.go): readExisting
		// without a lock (completed rows are terminal), lockExisting FOR UPDATE (failed rows
		// that may be rerun).
		readExisting: x(`SELECT ` + existingColumns + ` FROM {{table}} i
JOIN unnest($2::text[], $3::text[]) AS k(source, dedupe_key)
  ON i.source = k.source AND i.dedupe_key = k.dedupe_key
WHERE i.consumer = $1`),
		lockExisting: x(`SELECT ` + existingColumns + ` FROM {{table}} i
JOIN unnest($2::text[], $3::text[]) AS k(source, dedupe_key)
  ON i.source = k.source AND i.dedupe_key = k.dedupe_key
WHERE i.consumer = $1 FOR UPDATE OF i`),
		// markFailed is a handler's own mark of its message's row (MarkFailedTx), in the
		// handler's transaction: failed and poisoned, with the handler's reason.
		markFailed: x(`UPDATE {{table}}
SET status = 'failed', poisoned = true, failed_at = now(), completed_at = NULL, last_error = $4
WHERE consumer = $1 AND source = $2 AND dedupe_key = $3`),
		markCompleted: x(`UPDATE {{table}}
SET status = 'completed', completed_at = now(), poisoned = false, last_error = NULL
WHERE consumer = $1 AND source = $2 AND dedupe_key = $3`),
		markCompletedDO: x(`UPDATE {{table}}
SET status = 'completed', completed_at = now(), poisoned = false, last_error = NULL,
    payload_bytes = '', attributes = NULL, traceparent = NULL, tracestate = NULL,
    schema_version = NULL, schema_registry = NULL, schema_subject = NULL,
    schema_version_ref = NULL, schema_id = NULL, schema_fingerprint = NULL
WHERE consumer = $1 AND source = $2 AND dedupe_key = $3`),
		lookup: x(`SELECT ` + entry("payload_bytes") + `
FROM {{table}} WHERE consumer = $1 AND source = $2 AND dedupe_key = $3`),
		// listFailed lists archived ($7 true) or working failed rows, with at most $8 bytes of
		// each payload (pgtext.PrefixSQL).
		listFailed: x(`SELECT ` + entry(pgtext.PrefixSQL("payload_bytes", 8)) + `
FROM {{table}}
WHERE consumer = $1 AND status = 'failed' AND ($2 = '' OR source = $2)
  AND (failed_at, source, dedupe_key) > ($3, $4, $5) AND (archived_at IS NOT NULL) = $7
ORDER BY failed_at, source, dedupe_key
LIMIT $6`),
		// archive sets aside consumer $1's failed rows among the keys ($2, $3) not archived yet.
		archive: x(`UPDATE {{table}} i SET archived_at = now()
FROM unnest($2::text[], $3::text[]) AS k(source, dedupe_key)
WHERE i.consumer = $1 AND i.status = 'failed' AND i.archived_at IS NULL
  AND i.source = k.source AND i.dedupe_key = k.dedupe_key
RETURNING i.source, i.dedupe_key`),
		// search scans the consumer's rows (the primary key's prefix) for an exact source,
		// dedupe key, message id, key or event type: an operator's search (Admin.Search), with at
		// most $4 bytes of each payload.
		search: x(`SELECT ` + entry(pgtext.PrefixSQL("payload_bytes", 4)) + `
FROM {{table}}
WHERE consumer = $1
  AND (source = $2 OR dedupe_key = $2 OR message_id = $2 OR message_key = $2 OR event_type = $2)
ORDER BY received_at DESC, source, dedupe_key
LIMIT $3`),
		retryKeys: x(`UPDATE {{table}} i SET attempt_count = 0, poisoned = false, dead_lettered_at = NULL
FROM unnest($2::text[], $3::text[]) AS k(source, dedupe_key)
WHERE i.consumer = $1 AND i.status = 'failed' AND i.source = k.source AND i.dedupe_key = k.dedupe_key`),
		retryAll: x(`UPDATE {{table}} SET attempt_count = 0, poisoned = false, dead_lettered_at = NULL
WHERE consumer = $1 AND status = 'failed'`),
		deleteCompleted: x(`DELETE FROM {{table}} WHERE ctid = ANY (ARRAY (
  SELECT ctid FROM {{table}}
  WHERE consumer = $1 AND status = 'completed' AND completed_at < now() - $2::interval
  LIMIT $3))`),
		countFailed: x(`SELECT count(*) FROM {{table}} WHERE consumer = $1 AND status = 'failed'`),
		// Every consumer's rows, for status commands and the console (CountByConsumer).
		// Failed rows an operator archived count apart from the working ones, which alone
		// make the retrying and poisoned counts and the oldest failure.
		countByConsumer: x(`SELECT consumer,
       count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status = 'failed' AND NOT poisoned AND archived_at IS NULL),
       count(*) FILTER (WHERE status = 'failed' AND poisoned AND archived_at IS NULL),
       count(*) FILTER (WHERE status = 'failed' AND archived_at IS NOT NULL),
       min(failed_at) FILTER (WHERE status = 'failed' AND archived_at IS NULL)
FROM {{table}} GROUP BY consumer ORDER BY consumer`),
		// countByConsumer on a table before migration 011 (no archived_at, no archived row).
		countByConsumerUnarchived: x(`SELECT consumer,
       count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status = 'failed' AND NOT poisoned),
       count(*) FILTER (WHERE status = 'failed' AND poisoned),
       0::bigint,
       min(failed_at) FILTER (WHERE status = 'failed')
FROM {{table}} GROUP BY consumer ORDER BY consumer`),
		hasArchive: x(`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
WHERE attrelid = to_regclass('{{table}}') AND attname = 'archived_at' AND NOT attisdropped)`),
		// Consumer $1's rows per minute from $2 to $3: completed by completed_at, failed by
		// their last failure (Activity).
		activity: x(`SELECT true, date_bin('1 minute', completed_at, $2::timestamptz), count(*)
FROM {{table}} WHERE consumer = $1 AND status = 'completed' AND completed_at >= $2 AND completed_at < $3 GROUP BY 2
UNION ALL
SELECT false, date_bin('1 minute', failed_at, $2::timestamptz), count(*)
FROM {{table}} WHERE consumer = $1 AND status = 'failed' AND failed_at >= $2 AND failed_at < $3 GROUP BY 2`),
		// The runner's dead-letter produce of a poisoned row was acknowledged: later deliveries
		// of the message are duplicates.
		markDeadLettered: x(`UPDATE {{table}} SET dead_lettered_at = now()
WHERE consumer = $1 AND source = $2 AND dedupe_key = $3 AND status = 'failed'`)}
}

// rowColumns holds one array per bound column, for unnest. FlatArray encodes without
// reflection.
type rowColumns struct {
	source, dedupeKey, messageID, messageKey pgtype.FlatArray[pgtype.Text]
	sourceEventID                            pgtype.FlatArray[pgtype.UUID]
	sourceGlobalPosition                     pgtype.FlatArray[pgtype.Int8]
	destination, eventType                   pgtype.FlatArray[pgtype.Text]
	schemaVersion                            pgtype.FlatArray[pgtype.Int8]
	contentType                              pgtype.FlatArray[pgtype.Text]
	schemaRegistry, schemaSubject            pgtype.FlatArray[pgtype.Text]
	schemaVersionRef, schemaID               pgtype.FlatArray[pgtype.Int8]
	schemaFingerprint                        pgtype.FlatArray[pgtype.Text]
	causationID, correlationID               pgtype.FlatArray[pgtype.UUID]
	traceparent, tracestate, kafkaTopic      pgtype.FlatArray[pgtype.Text]
	kafkaPartition                           pgtype.FlatArray[pgtype.Int4]
	kafkaOffset                              pgtype.FlatArray[pgtype.Int8]
	payload                                  pgtype.FlatArray[[]byte]
	attributes                               pgtype.FlatArray[pgtype.Text]
	occurredAt                               pgtype.FlatArray[pgtype.Timestamptz]
}

func newRowColumns(n int) *rowColumns {
	return &rowColumns{
		source: make(pgtype.FlatArray[pgtype.Text], 0, n), dedupeKey: make(pgtype.FlatArray[pgtype.Text], 0, n),
		messageID: make(pgtype.FlatArray[pgtype.Text], 0, n), messageKey: make(pgtype.FlatArray[pgtype.Text], 0, n),
		sourceEventID: make(pgtype.FlatArray[pgtype.UUID], 0, n), sourceGlobalPosition: make(pgtype.FlatArray[pgtype.Int8], 0, n),
		destination: make(pgtype.FlatArray[pgtype.Text], 0, n), eventType: make(pgtype.FlatArray[pgtype.Text], 0, n),
		schemaVersion: make(pgtype.FlatArray[pgtype.Int8], 0, n), contentType: make(pgtype.FlatArray[pgtype.Text], 0, n),
		schemaRegistry: make(pgtype.FlatArray[pgtype.Text], 0, n), schemaSubject: make(pgtype.FlatArray[pgtype.Text], 0, n),
		schemaVersionRef: make(pgtype.FlatArray[pgtype.Int8], 0, n), schemaID: make(pgtype.FlatArray[pgtype.Int8], 0, n),
		schemaFingerprint: make(pgtype.FlatArray[pgtype.Text], 0, n), causationID: make(pgtype.FlatArray[pgtype.UUID], 0, n),
		correlationID: make(pgtype.FlatArray[pgtype.UUID], 0, n), traceparent: make(pgtype.FlatArray[pgtype.Text], 0, n),
		tracestate: make(pgtype.FlatArray[pgtype.Text], 0, n), kafkaTopic: make(pgtype.FlatArray[pgtype.Text], 0, n),
		kafkaPartition: make(pgtype.FlatArray[pgtype.Int4], 0, n), kafkaOffset: make(pgtype.FlatArray[pgtype.Int8], 0, n),
		payload: make(pgtype.FlatArray[[]byte], 0, n), attributes: make(pgtype.FlatArray[pgtype.Text], 0, n),
		occurredAt: make(pgtype.FlatArray[pgtype.Timestamptz], 0, n),
	}
}

func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: true} }

// nonEmpty stores "" as NULL (keiro's read-back maps NULL to "").
func nonEmpty(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

// storableKey stores a Kafka key as text when it is valid UTF-8 without NUL bytes, and as
// "\x" followed by its bytes in hex otherwise (a binary key, such as a Confluent-framed Avro
// key, is not text). The column is informational: handlers get the key as it came.
func storableKey(k *string) pgtype.Text {
	if k == nil {
		return pgtype.Text{}
	}
	if utf8.ValidString(*k) && !strings.Contains(*k, "\x00") {
		return text(*k)
	}
	return text(`\x` + hex.EncodeToString([]byte(*k)))
}

func optText(s *string) pgtype.Text {
	if s == nil {
		return pgtype.Text{}
	}
	return text(*s)
}

func optInt(i *int64) pgtype.Int8 {
	if i == nil {
		return pgtype.Int8{}
	}
	return pgtype.Int8{Int64: *i, Valid: true}
}

func optUUID(u *envelope.UUID) pgtype.UUID {
	if u == nil {
		return pgtype.UUID{}
	}
	return pgtype.UUID{Bytes: [16]byte(*u), Valid: true}
}

// add appends one delivery. full=false leaves out what the dedupe-only persistence mode does
// not store: payload, attributes, trace context, schema version and schema reference.
func (c *rowColumns) add(source, key string, d *Delivery, full bool) {
	ev := &d.Event
	c.source = append(c.source, text(source))
	c.dedupeKey = append(c.dedupeKey, text(key))
	c.messageID = append(c.messageID, nonEmpty(ev.MessageID))
	c.messageKey = append(c.messageKey, storableKey(ev.Key))
	c.sourceEventID = append(c.sourceEventID, optUUID(ev.SourceEventID))
	c.sourceGlobalPosition = append(c.sourceGlobalPosition, optInt(ev.SourceGlobalPosition))
	c.destination = append(c.destination, nonEmpty(ev.Destination))
	c.eventType = append(c.eventType, nonEmpty(ev.EventType))
	c.contentType = append(c.contentType, text(ev.ContentType))
	c.causationID = append(c.causationID, optUUID(ev.CausationID))
	c.correlationID = append(c.correlationID, optUUID(ev.CorrelationID))
	if d.Kafka != nil {
		c.kafkaTopic = append(c.kafkaTopic, text(d.Kafka.Topic))
		c.kafkaPartition = append(c.kafkaPartition, pgtype.Int4{Int32: d.Kafka.Partition, Valid: true})
		c.kafkaOffset = append(c.kafkaOffset, pgtype.Int8{Int64: d.Kafka.Offset, Valid: true})
	} else {
		c.kafkaTopic = append(c.kafkaTopic, pgtype.Text{})
		c.kafkaPartition = append(c.kafkaPartition, pgtype.Int4{})
		c.kafkaOffset = append(c.kafkaOffset, pgtype.Int8{})
	}
	if ev.OccurredAt.IsZero() {
		c.occurredAt = append(c.occurredAt, pgtype.Timestamptz{})
	} else {
		c.occurredAt = append(c.occurredAt, pgtype.Timestamptz{Time: ev.OccurredAt, Valid: true})
	}
	if !full {
		c.payload = append(c.payload, []byte{})
		c.attributes = append(c.attributes, pgtype.Text{})
		c.traceparent = append(c.traceparent, pgtype.Text{})
		c.tracestate = append(c.tracestate, pgtype.Text{})
		c.schemaVersion = append(c.schemaVersion, pgtype.Int8{})
		c.schemaRegistry = append(c.schemaRegistry, pgtype.Text{})
		c.schemaSubject = append(c.schemaSubject, pgtype.Text{})
		c.schemaVersionRef = append(c.schemaVersionRef, pgtype.Int8{})
		c.schemaID = append(c.schemaID, pgtype.Int8{})
		c.schemaFingerprint = append(c.schemaFingerprint, pgtype.Text{})
		return
	}
	payload := ev.Payload
	if payload == nil {
		payload = []byte{}
	}
	c.payload = append(c.payload, payload)
	if len(ev.Attributes) == 0 {
		c.attributes = append(c.attributes, pgtype.Text{})
	} else {
		c.attributes = append(c.attributes, text(string(ev.Attributes)))
	}
	if ev.TraceContext != nil {
		c.traceparent = append(c.traceparent, text(ev.TraceContext.Traceparent))
		c.tracestate = append(c.tracestate, nonEmpty(ev.TraceContext.Tracestate))
	} else {
		c.traceparent = append(c.traceparent, pgtype.Text{})
		c.tracestate = append(c.tracestate, pgtype.Text{})
	}
	c.schemaVersion = append(c.schemaVersion, pgtype.Int8{Int64: ev.SchemaVersion, Valid: true})
	ref := ev.SchemaRef
	if ref == nil {
		ref = &envelope.SchemaRef{}
	}
	c.schemaRegistry = append(c.schemaRegistry, optText(ref.Registry))
	c.schemaSubject = append(c.schemaSubject, optText(ref.Subject))
	c.schemaVersionRef = append(c.schemaVersionRef, optInt(ref.Version))
	c.schemaID = append(c.schemaID, optInt(ref.SchemaID))
	c.schemaFingerprint = append(c.schemaFingerprint, optText(ref.Fingerprint))
}

// makeStorable rewrites the columns that a DedupeOnly completed row leaves out (trace context,
// schema reference, attributes) so that PostgreSQL accepts them: text through pgtext.Storable,
// attributes with NUL characters replaced by U+FFFD (NULL when they are not JSON). A failed row
// uses it when its full envelope was refused, so that recording a failure never fails on
// content that a completed row would not store.
func (c *rowColumns) makeStorable() {
	for _, col := range []pgtype.FlatArray[pgtype.Text]{c.traceparent, c.tracestate, c.schemaRegistry,
		c.schemaSubject, c.schemaFingerprint} {
		for i := range col {
			if col[i].Valid {
				col[i].String = pgtext.Storable(col[i].String, math.MaxInt)
			}
		}
	}
	for i := range c.attributes {
		if c.attributes[i].Valid {
			c.attributes[i] = storableJSON(c.attributes[i].String)
		}
	}
}

// storableJSON returns doc with every NUL character in its strings and keys replaced by
// U+FFFD (jsonb refuses \u0000), or NULL when doc is not JSON.
func storableJSON(doc string) pgtype.Text {
	if !strings.Contains(doc, `\u0000`) && !strings.Contains(doc, "\x00") && utf8.ValidString(doc) && json.Valid([]byte(doc)) {
		return text(doc)
	}
	dec := json.NewDecoder(strings.NewReader(strings.ToValidUTF8(doc, "\uFFFD")))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return pgtype.Text{}
	}
	b, err := json.Marshal(replaceNUL(v))
	if err != nil {
		return pgtype.Text{}
	}
	return text(string(b))
}

func replaceNUL(v any) any {
	switch v := v.(type) {
	case string:
		return strings.ReplaceAll(v, "\x00", "\uFFFD")
	case []any:
		for i := range v {
			v[i] = replaceNUL(v[i])
		}
		return v
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[strings.ReplaceAll(k, "\x00", "\uFFFD")] = replaceNUL(e)
		}
		return out
	}
	return v
}

// args returns $2..$26 for the unnest statements.
func (c *rowColumns) args() []any {
	return []any{c.source, c.dedupeKey, c.messageID, c.messageKey, c.sourceEventID,
		c.sourceGlobalPosition, c.destination, c.eventType, c.schemaVersion, c.contentType,
		c.schemaRegistry, c.schemaSubject, c.schemaVersionRef, c.schemaID, c.schemaFingerprint,
		c.causationID, c.correlationID, c.traceparent, c.tracestate, c.kafkaTopic,
		c.kafkaPartition, c.kafkaOffset, c.payload, c.attributes, c.occurredAt}
}

// scanRow reads the columns of envelopeColumns plus the bookkeeping columns of lookup and
// listFailed into an Entry.
func scanEntry(row interface{ Scan(...any) error }) (Entry, error) {
	var (
		e                                             Entry
		source, key, msgID, msgKey, dest, evType, ct  pgtype.Text
		srcEvID, causID, corrID                       pgtype.UUID
		srcPos, schemaVer, verRef, schemaID, kafkaOff pgtype.Int8
		reg, subj, fp, tp, ts, kafkaTopic, attrs      pgtype.Text
		kafkaPart                                     pgtype.Int4
		payload                                       []byte
		occurred, received, completed, failed         pgtype.Timestamptz
		attempts                                      int32
	)
	err := row.Scan(&source, &key, &msgID, &msgKey, &srcEvID, &srcPos, &dest, &evType, &schemaVer,
		&ct, &reg, &subj, &verRef, &schemaID, &fp, &causID, &corrID, &tp, &ts, &kafkaTopic,
		&kafkaPart, &kafkaOff, &payload, &e.PayloadSize, &attrs, &occurred,
		&received, &e.Status, &attempts, &e.Poisoned, &completed, &failed, &e.LastError)
	if err != nil {
		return Entry{}, err
	}
	e.Source, e.DedupeKey, e.Attempts = source.String, key.String, int(attempts)
	e.ReceivedAt = received.Time
	if completed.Valid {
		t := completed.Time
		e.CompletedAt = &t
	}
	if failed.Valid {
		t := failed.Time
		e.FailedAt = &t
	}
	ev := &e.Delivery.Event
	ev.MessageID, ev.Source, ev.Destination, ev.EventType = msgID.String, source.String, dest.String, evType.String
	ev.ContentType, ev.SchemaVersion, ev.Payload = ct.String, schemaVer.Int64, payload
	if msgKey.Valid {
		k := msgKey.String
		ev.Key = &k
	}
	uuidPtr := func(u pgtype.UUID) *envelope.UUID {
		if !u.Valid {
			return nil
		}
		v := envelope.UUID(u.Bytes)
		return &v
	}
	intPtr := func(i pgtype.Int8) *int64 {
		if !i.Valid {
			return nil
		}
		v := i.Int64
		return &v
	}
	strPtr := func(s pgtype.Text) *string {
		if !s.Valid {
			return nil
		}
		v := s.String
		return &v
	}
	ev.SourceEventID, ev.CausationID, ev.CorrelationID = uuidPtr(srcEvID), uuidPtr(causID), uuidPtr(corrID)
	ev.SourceGlobalPosition = intPtr(srcPos)
	if reg.Valid || subj.Valid || verRef.Valid || schemaID.Valid || fp.Valid {
		ev.SchemaRef = &envelope.SchemaRef{Registry: strPtr(reg), Subject: strPtr(subj),
			Version: intPtr(verRef), SchemaID: intPtr(schemaID), Fingerprint: strPtr(fp)}
	}
	if tp.Valid {
		ev.TraceContext = &envelope.TraceContext{Traceparent: tp.String, Tracestate: ts.String}
	}
	if attrs.Valid {
		ev.Attributes = []byte(attrs.String)
	}
	if occurred.Valid {
		ev.OccurredAt = occurred.Time.UTC()
	} else {
		ev.OccurredAt = time.Unix(0, 0).UTC()
	}
	if kafkaTopic.Valid && kafkaPart.Valid && kafkaOff.Valid {
		e.Delivery.Kafka = &KafkaRef{Topic: kafkaTopic.String, Partition: kafkaPart.Int32, Offset: kafkaOff.Int64}
	}
	return e, nil
}

func intervalText(d time.Duration) string { return fmt.Sprintf("%d microseconds", d.Microseconds()) }
