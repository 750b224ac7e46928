package otelsetup_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"

	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/tracing"
	"github.com/keiro-go/keiro/tracing/otelsetup"
)

// A binary sets telemetry up from the OTEL_* environment, serves /metrics, and flushes on exit.
// With nothing configured, tracing is off and only the Prometheus metrics are live.
func ExampleSetup() {
	ctx := context.Background()
	tel, err := otelsetup.Setup(ctx, otelsetup.Options{
		ServiceName: "keiro-relay",
		// Getenv defaults to os.Getenv; an empty environment keeps the example deterministic.
		Getenv:    func(string) string { return "" },
		NoGlobals: true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = tel.Shutdown(ctx) }()

	published, _ := tracing.Meter(tel.MeterProvider()).Int64Counter(tracing.MetricOutboxPublished)
	published.Add(ctx, 2, metric.WithAttributes(tracing.DestinationKey.String("billing.orders.v1")))

	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for line := range strings.SplitSeq(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, "keiro_outbox_published_total") {
			fmt.Println(strings.Contains(line, `messaging_destination_name="billing.orders.v1"`), strings.HasSuffix(line, " 2"), strings.Contains(line, "otel_scope"))
		}
	}
	fmt.Println("tracing enabled:", tel.TracingEnabled())
	// Output:
	// true true false
	// tracing enabled: false
}

// Setup reports every invalid variable at once, each by name.
func ExampleSetup_invalid() {
	env := map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift", "OTEL_TRACES_SAMPLER": "sometimes"}
	_, err := otelsetup.Setup(context.Background(), otelsetup.Options{Getenv: func(k string) string { return env[k] }, NoGlobals: true})
	fmt.Println(err)
	// Output:
	// set up telemetry: OTEL_EXPORTER_OTLP_PROTOCOL="thrift": unknown protocol; want grpc or http/protobuf
	// OTEL_TRACES_SAMPLER="sometimes": unsupported sampler; want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio
}
