// Package tracing carries OpenTelemetry through keiro: W3C trace context captured from the
// enqueueing transaction onto the outbox row, onto the Kafka record's traceparent/tracestate
// headers, and back into the consumer's context; plus SDK setup from the standard OTEL_*
// environment variables and the Prometheus exporter behind each binary's /metrics.
package tracing
