// Package otelsetup builds the OpenTelemetry SDK for keiro's binaries from the standard OTEL_*
// environment variables: the tracer provider with its OTLP (gRPC or HTTP) or console exporter
// and sampler, the meter provider with the Prometheus exporter behind /metrics and an optional
// OTLP metric push, the resource, and the W3C propagator.
//
// It is opt-in. The library packages (outbox, inbox, events, envelope, schema) and package
// tracing depend on the OpenTelemetry API only and report through the providers they are given
// or the otel globals; this package is what installs those globals in cmd/relay, cmd/consumer
// and cmd/demo. A service that embeds the relay or the consumer imports it to get the same
// OTEL_* behaviour as the binaries, or builds its providers itself (then pass
// [HistogramViews] to sdkmetric.NewMeterProvider for keiro's bucket boundaries).
//
// # Guarantees
//
//   - No cost when unconfigured: [Setup] installs a TracerProvider only when a trace exporter
//     is configured, so spans stay no-ops. Metrics always go to a Prometheus registry of their
//     own ([Telemetry.Registry]), never the process-wide default registry.
//   - A collector outage never blocks or fails the application: spans are batched and dropped
//     on export failure, reported through otel's error handler.
//   - Configuration errors are reported all at once, each naming its OTEL_* variable.
//
// docs/observability.md is the reference for the variables and the metric names.
package otelsetup
