// Package tracing carries OpenTelemetry through keiro: W3C trace context captured from the
// enqueueing transaction onto the outbox row, onto the Kafka record's traceparent/tracestate
// headers, and back into the consumer's context; and the instruments and vocabulary of keiro's
// metrics and spans.
//
// It depends on the OpenTelemetry API only (go.opentelemetry.io/otel, otel/trace, otel/metric,
// propagation), as do the library packages that use it: a service importing outbox or inbox
// gets no SDK, exporter or Prometheus dependency. The SDK setup from the standard OTEL_*
// environment variables and the Prometheus exporter behind each binary's /metrics live in the
// opt-in package [github.com/keiro-go/keiro/tracing/otelsetup], which the binaries import;
// a service imports it, or sets the otel globals up its own way, or neither.
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
//   - No cost when unconfigured: with no SDK installed (or otelsetup.Setup with no trace
//     exporter configured, which installs no TracerProvider) spans stay no-ops and
//     [RecordTraceContext] forwards the stored context verbatim.
//
// # Vocabulary
//
// Instruments live in scope [ScopeName] ("keiro"); [MetricNames] lists every metric the product
// emits with its kind, unit and attributes, and the attribute keys of spans and metrics are
// constants here. Metric attributes are bounded (topic, source, consumer, outcome, partition);
// message ids and record keys appear on spans only. docs/observability.md is the reference.
package tracing
