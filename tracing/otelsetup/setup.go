package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/keiro-go/keiro/tracing"
)

// DefaultServiceName is the service.name used when neither OTEL_SERVICE_NAME, the service.name
// entry of OTEL_RESOURCE_ATTRIBUTES, nor [Options.ServiceName] is set.
const DefaultServiceName = "keiro"

// Options configures [Setup]. The OTEL_* environment variables take precedence over it, as the
// OpenTelemetry specification requires.
type Options struct {
	// ServiceName is the service.name resource attribute, overridden by OTEL_SERVICE_NAME and by
	// service.name in OTEL_RESOURCE_ATTRIBUTES. Defaults to [DefaultServiceName].
	ServiceName string
	// ServiceVersion is the service.version resource attribute. Defaults to "" (not set).
	ServiceVersion string
	// Console receives spans when OTEL_TRACES_EXPORTER includes console. Defaults to os.Stdout.
	Console io.Writer
	// NoGlobals keeps Setup from installing its providers and the W3C propagator as the otel
	// globals; use [Telemetry.TracerProvider] and [Telemetry.MeterProvider] explicitly then.
	// Defaults to false: the globals are installed, so components whose MeterProvider and
	// TracerProvider fields are nil report through Setup's providers.
	NoGlobals bool
	// Getenv reads the environment. Defaults to os.Getenv. The OTLP exporters also read their
	// own variables (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _CERTIFICATE, ...) from the process
	// environment.
	Getenv func(string) string
}

// Telemetry holds the providers [Setup] built. Its zero value is not usable; a nil *Telemetry is
// not either.
type Telemetry struct {
	tp       *sdktrace.TracerProvider // nil when no exporter is configured
	mp       *sdkmetric.MeterProvider // nil when metrics are disabled
	registry *prometheus.Registry
	handler  http.Handler
}

// Setup builds OpenTelemetry from the standard OTEL_* environment variables:
//
//   - OTEL_SDK_DISABLED=true: no tracer and no meter provider; /metrics serves only the Go
//     runtime and process collectors.
//   - OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: the resource of spans and the target_info
//     series.
//   - OTEL_TRACES_EXPORTER: comma-separated none, otlp, console. Unset means otlp when an OTLP
//     endpoint is set and none otherwise: with nothing configured no TracerProvider is
//     installed and every span is a no-op.
//   - OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: where otlp sends
//     (http:// means plaintext). The generic endpoint gets /v1/traces appended for
//     http/protobuf; the traces endpoint is used as is.
//   - OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: grpc or http/protobuf
//     (the default, so port 4318; set grpc for port 4317).
//   - OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG: always_on, always_off, traceidratio,
//     parentbased_always_on (default), parentbased_always_off, parentbased_traceidratio.
//   - OTEL_METRICS_EXPORTER: prometheus (default), otlp, both comma-separated, or none.
//     prometheus serves the metrics on [Telemetry.MetricsHandler] (pull); otlp pushes them to
//     OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (used as is) or OTEL_EXPORTER_OTLP_ENDPOINT (with
//     /v1/metrics appended for http/protobuf), with OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or
//     the generic protocol, every OTEL_METRIC_EXPORT_INTERVAL (60 s by default).
//
// The Prometheus exporter has a registry of its own, served by [Telemetry.MetricsHandler];
// its series carry no otel_scope_* labels. Histograms of [tracing.MetricNames] get their bucket
// boundaries through views ([HistogramViews]). The global propagator becomes W3C TraceContext + Baggage. An invalid variable is an
// error naming it; all problems are reported at once. Call [Telemetry.Shutdown] to flush.
func Setup(ctx context.Context, opts Options) (*Telemetry, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	cfg, err := readEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("set up telemetry: %w", err)
	}

	t := &Telemetry{registry: prometheus.NewRegistry()}
	t.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	t.handler = promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{Registry: t.registry})

	if !opts.NoGlobals {
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	}
	if cfg.disabled {
		return t, nil
	}

	res, err := buildResource(ctx, opts, cfg)
	if err != nil {
		return nil, fmt.Errorf("set up telemetry: build resource: %w", err)
	}

	if !cfg.metricsDisabled {
		mopts := []sdkmetric.Option{sdkmetric.WithResource(res)}
		if cfg.metricsPrometheus {
			exp, err := otelprom.New(
				otelprom.WithRegisterer(t.registry),
				otelprom.WithoutScopeInfo(),
				otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
			)
			if err != nil {
				return nil, fmt.Errorf("set up telemetry: prometheus exporter: %w", err)
			}
			mopts = append(mopts, sdkmetric.WithReader(exp))
		}
		if cfg.metricsOTLP {
			exp, err := newOTLPMetricExporter(ctx, cfg)
			if err != nil {
				return nil, fmt.Errorf("set up telemetry: otlp metric exporter: %w", err)
			}
			// The interval and timeout come from OTEL_METRIC_EXPORT_INTERVAL and
			// OTEL_METRIC_EXPORT_TIMEOUT (default 60 s and 30 s), read by the SDK.
			mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
		}
		mopts = append(mopts, HistogramViews()...)
		t.mp = sdkmetric.NewMeterProvider(mopts...)
	}

	if len(cfg.exporters) > 0 {
		topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithSampler(cfg.sampler)}
		for _, name := range cfg.exporters {
			switch name {
			case "otlp":
				exp, err := newOTLPExporter(ctx, cfg)
				if err != nil {
					return nil, errors.Join(fmt.Errorf("set up telemetry: otlp trace exporter: %w", err), t.Shutdown(ctx))
				}
				topts = append(topts, sdktrace.WithBatcher(exp))
			case "console":
				w := opts.Console
				if w == nil {
					w = os.Stdout
				}
				exp, err := stdouttrace.New(stdouttrace.WithWriter(w))
				if err != nil {
					return nil, errors.Join(fmt.Errorf("set up telemetry: console trace exporter: %w", err), t.Shutdown(ctx))
				}
				topts = append(topts, sdktrace.WithSyncer(exp))
			}
		}
		t.tp = sdktrace.NewTracerProvider(topts...)
	}

	if !opts.NoGlobals {
		if t.mp != nil {
			otel.SetMeterProvider(t.mp)
		}
		if t.tp != nil {
			otel.SetTracerProvider(t.tp)
		}
	}
	return t, nil
}

// HistogramViews returns one view per histogram of [tracing.MetricNames] in scope "keiro", setting its
// explicit bucket boundaries. [Setup] installs them; pass them to sdkmetric.NewMeterProvider
// when building a provider by hand (tests).
func HistogramViews() []sdkmetric.Option {
	var out []sdkmetric.Option
	for _, m := range tracing.MetricNames {
		if m.Kind != tracing.Histogram {
			continue
		}
		out = append(out, sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Name: m.Name, Scope: instrumentation.Scope{Name: tracing.ScopeName}},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: m.Buckets}},
		)))
	}
	return out
}

func buildResource(ctx context.Context, opts Options, cfg envConfig) (*resource.Resource, error) {
	name := opts.ServiceName
	if name == "" {
		name = DefaultServiceName
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if opts.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", opts.ServiceVersion))
	}
	// Later entries win: code, then OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME.
	attrs = append(attrs, cfg.resourceAttrs...)
	if cfg.serviceName != "" {
		attrs = append(attrs, attribute.String("service.name", cfg.serviceName))
	}
	return resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(attrs...))
}

func newOTLPExporter(ctx context.Context, cfg envConfig) (sdktrace.SpanExporter, error) {
	if cfg.protocol == ProtocolGRPC {
		var o []otlptracegrpc.Option
		if cfg.endpointURL != "" {
			o = append(o, otlptracegrpc.WithEndpointURL(cfg.endpointURL))
		}
		return otlptracegrpc.New(ctx, o...)
	}
	var o []otlptracehttp.Option
	if cfg.endpointURL != "" {
		o = append(o, otlptracehttp.WithEndpointURL(cfg.endpointURL))
	}
	return otlptracehttp.New(ctx, o...)
}

func newOTLPMetricExporter(ctx context.Context, cfg envConfig) (sdkmetric.Exporter, error) {
	if cfg.metricsProtocol == ProtocolGRPC {
		var o []otlpmetricgrpc.Option
		if cfg.metricsEndpointURL != "" {
			o = append(o, otlpmetricgrpc.WithEndpointURL(cfg.metricsEndpointURL))
		}
		return otlpmetricgrpc.New(ctx, o...)
	}
	var o []otlpmetrichttp.Option
	if cfg.metricsEndpointURL != "" {
		o = append(o, otlpmetrichttp.WithEndpointURL(cfg.metricsEndpointURL))
	}
	return otlpmetrichttp.New(ctx, o...)
}

// MetricsHandler serves the Prometheus exposition of keiro's metrics (plus the Go runtime and
// process collectors) for a /metrics endpoint.
func (t *Telemetry) MetricsHandler() http.Handler { return t.handler }

// Registry returns the Prometheus registry behind [Telemetry.MetricsHandler], to register
// further collectors.
func (t *Telemetry) Registry() *prometheus.Registry { return t.registry }

// TracerProvider returns the SDK tracer provider, or a no-op provider when no trace exporter is
// configured. Pass it to components' TracerProvider fields when Options.NoGlobals is set.
func (t *Telemetry) TracerProvider() trace.TracerProvider {
	if t.tp == nil {
		return tracenoop.NewTracerProvider()
	}
	return t.tp
}

// MeterProvider returns the SDK meter provider, or a no-op provider when metrics are disabled.
func (t *Telemetry) MeterProvider() metric.MeterProvider {
	if t.mp == nil {
		return metricnoop.NewMeterProvider()
	}
	return t.mp
}

// TracingEnabled reports whether a trace exporter is configured, that is whether spans are
// recorded at all.
func (t *Telemetry) TracingEnabled() bool { return t.tp != nil }

// Shutdown flushes pending spans and stops the providers. It is safe to call more than once;
// later calls return the SDK's "already shut down" errors, which callers may ignore.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.tp != nil {
		if err := t.tp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shut down tracer provider: %w", err))
		}
	}
	if t.mp != nil {
		if err := t.mp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shut down meter provider: %w", err))
		}
	}
	return errors.Join(errs...)
}
