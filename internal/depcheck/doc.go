// Package depcheck holds a test that keeps the library packages lean: outbox, inbox, events,
// envelope, schema and tracing depend on the OpenTelemetry API only, never on the SDK, its
// exporters, gRPC, protobuf, Prometheus, the migration runner (tern and its template library)
// or the QA-only tools (compose-go, BuildKit, chromedp), and the number of modules a service
// importing outbox and inbox links stays within a budget. Such a service links neither
// text/template nor html/template nor the Avro codec, and the binary of examples/minimal-service
// keeps the linker's dead method elimination (nothing reaches reflect.Value.Method or
// MethodByName) and stays within a budget over its floor, testdata/floor: the same service
// written against pgx and franz-go alone.
//
// The facts come from `go list -deps` and from the linker (`go build -ldflags=-dumpdep`), so the
// tests depend on the build, not on the machine.
// The opt-in packages that bring those dependencies are tracing/otelsetup (telemetry setup from
// OTEL_*), migrations (the tern runner) and the modules of their own (deploy/compose/validate,
// console/browsertest).
package depcheck
