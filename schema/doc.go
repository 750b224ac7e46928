// Package schema carries Avro payloads through keiro-go: Confluent wire framing, a caching
// Confluent Schema Registry client, a [Serializer] that fills an envelope event's payload,
// content type and schema reference when enqueuing, and a [Deserializer] that decodes
// consumed payloads (to Go values, or to JSON for handlers that expect JSON).
//
// # Wire format
//
// A payload is the Confluent frame: magic byte 0, the writer schema's registry id as a 4-byte
// big-endian integer, then the Avro binary encoding of one datum. The content type written is
// [ContentTypeAvro] ("application/avro"); [IsAvroContentType] also accepts the other names in
// use. The envelope's SchemaRef gets the registry name, subject, version, schema id and
// [Fingerprint] (CRC-64-AVRO of the specification's Parsing Canonical Form, 16 lowercase hex
// digits).
//
// # Guarantees
//
//   - Steady state makes no HTTP request: schemas by id, by subject and version, and the
//     identity of a schema text under a subject are cached for the life of the [Registry]
//     (they never change in a registry). Concurrent misses for one key make one request.
//   - A registry outage loses nothing. Cached schemas keep working. A miss is retried with
//     capped exponential backoff, then fails with [ErrRegistryUnavailable], which is
//     retryable: the outbox row or the consumed message stays where it is and is tried again.
//   - Bad bytes never panic and never allocate without bound: a payload is checked against its
//     writer schema's layout (block counts against the bytes left, nesting depth) before goavro
//     decodes it. Every such failure matches [ErrMalformedPayload] (and one of
//     [ErrWrongMagicByte], [ErrTruncatedFrame], [ErrUnknownSchemaID], [ErrPayloadMismatch]):
//     it is permanent, and a consumer should dead-letter the message with the error text.
//   - The serializer is lookup-only by default: the schema must already be registered under
//     the subject ([TopicNameStrategy], [RecordNameStrategy] or [TopicRecordNameStrategy]),
//     and the error names the subject and says how to register it. AutoRegister is for
//     development.
//
// Registry credentials: the password is never printed ([RegistryConfig.String] redacts it,
// errors do not contain it).
package schema
