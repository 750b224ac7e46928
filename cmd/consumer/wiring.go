package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/inbox/handlers"
	"github.com/keiro-go/keiro/schema"
)

// dedupePolicy maps --dedupe-policy to the inbox policy.
func dedupePolicy(name string) inbox.DedupePolicy {
	switch name {
	case "source-event":
		return inbox.DedupeSourceEventIdentity
	case "kafka-delivery":
		return inbox.DedupeKafkaDelivery
	}
	return inbox.DedupeMessageID
}

// persistence maps --persistence to the inbox mode.
func persistence(name string) inbox.Persistence {
	if name == "dedupe-only" {
		return inbox.DedupeOnly
	}
	return inbox.FullEnvelope
}

// builtHandler is the configured handler and what must be released when the command ends.
type builtHandler struct {
	handle inbox.Handler
	// batch is the handler's batch form, nil when it has none (http).
	batch inbox.BatchHandler
	close func()
}

// buildHandler builds the handler of --handler for the inbox consumer named consumer, whose
// rows are deduplicated under policy (the HTTP Idempotency-Key repeats the dedupe key).
func buildHandler(f *handlerFlags, consumer string, policy inbox.DedupePolicy, log *slog.Logger) (*builtHandler, error) {
	b := &builtHandler{close: func() {}}
	var decode handlers.PayloadDecoder
	if f.SchemaRegistryURL != "" {
		reg, err := schema.NewRegistry(schema.RegistryConfig{
			URL:      f.SchemaRegistryURL.Reveal(),
			Username: f.SchemaRegistryUser,
			Password: f.SchemaRegistryPassword.Reveal(),
		})
		if err != nil {
			return nil, fmt.Errorf("schema registry: %w", err)
		}
		des, err := schema.NewDeserializer(reg, schema.DeserializerConfig{})
		if err != nil {
			reg.Close()
			return nil, err
		}
		decode = handlers.AvroDecoder(des)
		b.close = reg.Close
	}
	switch f.Handler {
	case "http":
		hdr, err := f.headers()
		if err != nil {
			return nil, fmt.Errorf("--http-header: %w", err)
		}
		h, err := handlers.NewHTTP(handlers.HTTPConfig{
			URL:           f.HTTPURL.Reveal(),
			Consumer:      consumer,
			Timeout:       f.HTTPTimeout,
			Header:        hdr,
			Format:        f.HTTPFormat,
			DecodePayload: decode,
			DedupeKey:     idempotencyDedupeKey(policy, log),
		})
		if err != nil {
			return nil, err
		}
		prev := b.close
		b.handle, b.close = h.Handle, func() { h.CloseIdleConnections(); prev() }
	case "sql":
		h, err := handlers.NewSQL(handlers.SQLConfig{Function: f.SQLFunction, DecodePayload: decode})
		if err != nil {
			return nil, err
		}
		b.handle, b.batch = h.Handle, h.HandleBatch
	default:
		return nil, fmt.Errorf("unknown handler mode %q: use http or sql", f.Handler)
	}
	return b, nil
}

// idempotencyDedupeKey returns the dedupe key the HTTP handler puts in the Idempotency-Key:
// the inbox's own key when the policy can be computed from the event alone; with the
// kafka-delivery policy (whose key needs the record's coordinates, which handlers do not see)
// it falls back to the message id.
func idempotencyDedupeKey(policy inbox.DedupePolicy, log *slog.Logger) func(context.Context, envelope.Event) string {
	if policy.String() == inbox.DedupeKafkaDelivery.String() {
		if log != nil {
			log.Warn("with --dedupe-policy=kafka-delivery the HTTP Idempotency-Key carries the message id, not topic:partition:offset")
		}
		return func(_ context.Context, ev envelope.Event) string { return ev.MessageID }
	}
	return func(_ context.Context, ev envelope.Event) string {
		k, err := policy.Key(inbox.Delivery{Event: ev})
		if err != nil {
			return ev.MessageID
		}
		return k
	}
}
