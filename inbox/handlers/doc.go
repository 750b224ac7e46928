// Package handlers provides the consumer's ready-made handler modes: deliver each inbox
// event to an HTTP endpoint ([HTTP]) or to a PostgreSQL function inside the inbox transaction
// ([SQL]). Both hand the event over as the same JSON [Document].
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
//   - HTTP: 2xx is success. 408, 429 and 5xx, timeouts and connection errors are retried (a
//     Retry-After header is reported through [RetryAfter]). Every other status (4xx, and
//     1xx/3xx that the client did not follow) is permanent; the error carries the status and
//     the first bytes of the response body.
//   - SQL: the function poisons a message by raising SQLSTATE KP001 (RAISE EXCEPTION ... USING
//     ERRCODE = 'KP001') or any class 22 "data exception" (invalid_text_representation,
//     numeric_value_out_of_range, ...), errors that the same input will always produce. Every
//     other error (serialization failures, deadlocks, lock timeouts, integrity violations such as
//     a missing foreign-key parent that may arrive later, an undefined function an operator can
//     still create) is retried.
//   - Both: a payload whose content type says JSON but that is not valid JSON is permanent.
package handlers
