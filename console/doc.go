// Package console is keiro's operator console: a JSON admin API under /api/v1/ and a
// server-rendered web console under /console/, served by one [http.Handler] that the relay and
// consumer sidecars mount next to /healthz, /readyz and /metrics, and that a service embedding
// the relay or the consumer can mount on its own mux.
//
// It answers an operator's four questions: what is waiting and for how long (outbox backlog per
// destination, oldest pending age), what is stuck or dead and why (dead, rejected and retrying
// outbox rows; failed and poisoned inbox rows, with every keiro header and the payload), how far
// behind each consumer group is (committed offset against the log end offset of every
// partition, read from Kafka when asked), and what can safely be sent again (requeue of outbox
// rows with the ordering caveat, re-run of inbox failures through the handler).
//
// # Actions and their guarantees
//
// Requeue is [outbox.Admin.RequeueTx], the same function as `relay dead requeue`: only dead and
// rejected rows move, in one transaction, and listening relays are woken. Retry is
// [inbox.Admin.Reprocess] for each row, the same as `consumer inbox failed retry`: the handler
// runs again from the stored envelope inside an inbox transaction, so a success marks the row
// completed exactly once.
//
// # Security
//
// Every request needs credentials unless [AuthConfig.AllowUnauthenticated] is set (the sidecars
// set it only when bound to loopback): `Authorization: Bearer TOKEN`, or basic auth whose
// password is the token (the user name is recorded as who acted). State changes are POST only,
// refused in read-only mode, checked for a same-origin Origin or Referer and for a CSRF token
// (a form field in the console; the X-CSRF-Token header, or a bearer token, in the API), and
// logged with who did what. Every list is paged with a bounded page size; payload previews are
// size-capped; everything stored is rendered escaped.
package console
