// Package depcheck holds a test that keeps the library packages lean: outbox, inbox, events,
// envelope, schema and tracing depend on the OpenTelemetry API only, never on the SDK, its
// exporters, gRPC, protobuf, Prometheus, the migration runner (tern and its template library)
// or the QA-only tools (compose-go, BuildKit, chromedp), and the number of modules a service
// importing outbox and inbox links stays within a budget.
//
// The facts come from `go list -deps`, so the test depends on the build, not on the machine.
// The opt-in packages that bring those dependencies are tracing/otelsetup (telemetry setup from
// OTEL_*), migrations (the tern runner) and the modules of their own (internal/composecheck,
// console/browsertest).
package depcheck
