// Package handlers provides the consumer's ready-made handler modes: deliver each inbox
// event to an HTTP endpoint ([HTTP]) or to a PostgreSQL function inside the inbox transaction
// ([SQL]). Both hand the event over as the same JSON [Document]. [Forward] is the consume →
// produce handler of a Go service: it maps each consumed event to events enqueued into the
// outbox in the inbox transaction, so a record read from one topic yields its outbox rows once.
//
// # Guarantees
//
// The two modes differ in what "once" means:
//
//   - SQL mode is exactly-once for the function's effects. The function runs in the inbox
//     transaction, so its writes and the inbox row commit or roll back together; a redelivered
//     message finds the completed inbox row and never calls the function again (within the
//     inbox retention window).
//   - HTTP mode is at-least-once towards the service. The HTTP call cannot join the database
//     transaction: if the process dies after the service answered 2xx but before the inbox row
//     committed, the message is delivered again. Every request therefore carries an
//     Idempotency-Key header (<consumer>:<source>:<dedupe key>) that stays the same across
//     redeliveries, so the service can drop repeats.
//
// # Failure classification
//
// A handler error is retried by the inbox runner unless it is wrapped as permanent
// (inbox.Permanent), which poisons the message at once and sends it to the dead-letter topic.
//
//   - HTTP: 2xx is success. An unreachable or overloaded target (connection refused or reset,
//     timeouts, TLS failures, a malformed answer, 429, 502, 503, 504) is an outage of the
//     target (inbox.Outage, with the Retry-After delay): the runner waits with backoff and uses
//     no attempt. 408 and other 5xx are retried and use an attempt. Every other status (4xx,
//     and 1xx/3xx that the client did not follow) is permanent; the error carries the status
//     and the first bytes of the response body. An event the request cannot carry is
//     permanent: a value taken from the event for a header without an encoding rule
//     (Idempotency-Key, the Content-Type of cloudevents-binary) that the HTTP client would
//     refuse ([ErrInvalidHeaderValue]), an event a CloudEvents format cannot represent
//     ([ErrInvalidCloudEvent]). The ce-* attributes of cloudevents-binary are percent-encoded
//     as the CloudEvents HTTP binding asks, so any bytes (a binary key) travel. A request the
//     client refuses for another reason before sending it is never an outage: it uses an
//     attempt. Errors name the URL's scheme, host and path only, never its userinfo or query.
//   - SQL: the function poisons a message by raising SQLSTATE KP001 (RAISE EXCEPTION ... USING
//     ERRCODE = 'KP001') or any class 22 "data exception" (invalid_text_representation,
//     numeric_value_out_of_range, ...), errors that the same input will always produce. The
//     handler's function being undefined (42883 on its own call: dropped, or being replaced) is
//     an outage and uses no attempt (42883 raised inside the function uses attempts);
//     contention (serialization failures, deadlocks, lock timeouts) uses no attempt for the
//     runner's first MaxContentionRetries retries of a message. Every other error (integrity
//     violations such as a missing foreign-key parent that may arrive later, ...) is retried
//     and uses an attempt.
//   - Both: a payload whose content type says JSON but that is not valid JSON (UTF-8) is
//     permanent ([ErrInvalidJSONPayload]), and so is a text field (id, source, destination,
//     type, content type, key) that is not valid UTF-8 where a JSON document carries it
//     ([ErrInvalidUTF8]): JSON cannot hold it unchanged. With [AvroDecoder], a payload that
//     cannot decode is permanent and an unreachable schema registry is an outage.
package handlers
