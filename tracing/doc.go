// Package tracing carries OpenTelemetry through keiro: W3C trace context captured from the
// enqueueing transaction onto the outbox row, onto the Kafka record's traceparent/tracestate
// headers, and back into the consumer's context; plus SDK setup from the standard OTEL_*
// environment variables and the Prometheus exporter behind each binary's /metrics.
//
// # Guarantees
//
//   - One trace per message: [FromContext] stores the business span's context on the outbox
//     row; the relay's "send <topic>" Producer span starts from it ([ContextWith]) and
//     [RecordTraceContext] puts the send span's context in the record headers; the consumer's
//     "process <topic>" Consumer span has that context as parent and as a link
//     ([ProcessSpanStart]); the handler's ctx carries the process span.
//   - Only W3C traceparent and tracestate travel on the wire, whatever global propagator the
//     application installed (keiro's wire contract).
//   - No cost when unconfigured: [Setup] installs a TracerProvider only when a trace exporter is
//     configured, so spans stay no-ops and, with no SDK at all, [RecordTraceContext] forwards the
//     stored context verbatim. Metrics always go to a Prometheus registry of their own, never the
//     process-wide default registry.
//   - A collector outage never blocks or fails the application: spans are batched and dropped
//     on export failure, reported through otel's error handler.
//   - Configuration errors are reported all at once, each naming its OTEL_* variable.
//
// # Vocabulary
//
// Instruments live in scope [ScopeName] ("keiro"); [MetricNames] lists every metric the product
// emits with its kind, unit and attributes, and the attribute keys of spans and metrics are
// constants here. Metric attributes are bounded (topic, source, consumer, outcome, partition);
// message ids and record keys appear on spans only. docs/observability.md is the reference.
package tracing
