// Package backoff is the one retry delay of keiro: a capped exponential backoff with equal
// jitter, and the context-aware wait that sleeps it. The relay (outbox.Backoff), the consumer
// (inbox.Backoff), the event store's command runner and subscriptions (events.Backoff) and the
// schema registry client all space their retries with it; those public names are aliases of
// [Backoff], so a value configured for one is the same type as for another.
package backoff
