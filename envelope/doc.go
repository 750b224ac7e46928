// Package envelope defines the integration event ([Event]) and its Kafka wire contract: the
// 19 keiro headers, their order and value formats, decoding with keiro's check order and typed
// errors, and an optional CloudEvents binary-mode profile.
//
// The record key is the event's Key and the record value is its Payload; everything else
// travels in headers, byte-compatible with the Haskell library keiro, so a keiro consumer
// decodes records produced here and this package decodes theirs.
//
// # Guarantees
//
//   - Encoding ([Event.AppendHeaders], [Event.Record]) emits the headers in keiro's order
//     ([HeaderNames]); the six identity headers, content-type and keiro-occurred-at always,
//     the others only when their field is set. Integers are decimal, UUIDs lowercase and
//     hyphenated, keiro-occurred-at is ISO-8601 UTC exactly as Haskell's iso8601Show prints it
//     ("2023-02-25T00:00:00Z", "2023-02-25T00:00:00.12Z"), keiro-attributes is compact JSON.
//   - Decoding ([Decode]) checks the headers in keiro's order and returns the first problem as
//     a *[HeaderError] whose Kind mirrors keiro's KafkaDecodeError; errors.Is works with
//     [ErrMissingHeader], [ErrInvalidIntHeader], [ErrInvalidUUIDHeader], [ErrInvalidTimeHeader]
//     and [ErrInvalidJSONHeader]. Lookups are exact and case-sensitive; the first header of a
//     name wins.
//   - For every record that decodes, re-encoding the event and decoding again gives the same
//     event (checked by FuzzDecode), and Decode(Encode(e)) == e for every event whose
//     Attributes are compact JSON and whose OccurredAt lies in years 0000–9999.
//
// # Decisions beyond keiro
//
//   - Bytes are kept verbatim: keiro's pure decoder receives text, so it has no UTF-8 error,
//     and rejecting invalid UTF-8 here would refuse records keiro's adapter accepts. Decode
//     therefore never checks UTF-8; [Event.Validate] rejects invalid UTF-8 on the producer side,
//     because a keiro consumer cannot represent it.
//   - Integers outside int64 are InvalidIntHeader (Haskell's Int would wrap silently).
//   - keiro-occurred-at accepts what keiro emits (up to 12 fraction digits, truncated to
//     nanoseconds) and explicit offsets ("+00:00", "-05:00"), converted to UTC. Times outside
//     years 0000–9999 are rejected so that every decoded time re-encodes.
//   - keiro-attributes is stored compacted, so decode → encode → decode is stable.
//
// # CloudEvents binary mode
//
// [EncodeOptions].CloudEvents adds ce_id (MessageID), ce_source (Source), ce_type (EventType),
// ce_specversion ("1.0"), ce_time (OccurredAt, RFC 3339) and, when the event has a key,
// ce_partitionkey (the Kafka binding's partitioning extension, which mirrors the record key),
// after the keiro headers. ce_subject is not emitted: its meaning is producer-defined, and the
// key already has a standard CloudEvents home. content-type is shared by both profiles.
//
// Decode accepts a record with no keiro-source and no keiro-message-id but with ce_* headers:
// ce_specversion, ce_source, ce_type, content-type and ce_id are required (checked in that
// order; a missing one is a MissingHeader naming it); Destination is keiro-destination if
// present, else the record's topic; SchemaVersion is keiro-schema-version if present, else 0
// (ce_dataschema is a URI, not a version, and is not mapped); OccurredAt is ce_time (RFC 3339,
// lowercase 't'/'z' and any number of fraction digits accepted), else keiro-occurred-at, else
// the record timestamp. The optional keiro headers (schema reference, ids, trace context,
// attributes) are read as in the keiro profile.
//
// The package depends on the standard library only.
package envelope
