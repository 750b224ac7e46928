package otelsetup

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	collectormetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/tracing"
)

// env is a fake environment for Options.Getenv.
type env map[string]string

func (e env) get(k string) string { return e[k] }

func setup(t *testing.T, e env, opts Options) *Telemetry {
	t.Helper()
	opts.Getenv = e.get
	opts.NoGlobals = true
	tel, err := Setup(context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel
}

func TestReadEnvErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		env  env
		want string
	}{
		{env{EnvSDKDisabled: "yes"}, EnvSDKDisabled},
		{env{EnvResourceAttributes: "a=1,broken"}, EnvResourceAttributes},
		{env{EnvResourceAttributes: "a=%zz"}, EnvResourceAttributes},
		{env{EnvTracesExporter: "jaeger"}, EnvTracesExporter},
		{env{EnvTracesExporter: "none,otlp"}, EnvTracesExporter},
		{env{EnvMetricsExporter: "statsd"}, EnvMetricsExporter},
		{env{EnvMetricsExporter: "none,otlp"}, EnvMetricsExporter},
		{env{EnvMetricsExporter: "otlp", EnvOTLPMetricsEndpoint: "ftp://x:1"}, EnvOTLPMetricsEndpoint},
		{env{EnvMetricsExporter: "otlp", EnvOTLPMetricsProtocol: "udp"}, EnvOTLPMetricsProtocol},
		{env{EnvOTLPProtocol: "thrift"}, EnvOTLPProtocol},
		{env{EnvOTLPProtocol: "http/json"}, EnvOTLPProtocol},
		{env{EnvOTLPTracesProtocol: "udp"}, EnvOTLPTracesProtocol},
		{env{EnvOTLPEndpoint: "jaeger:4317"}, EnvOTLPEndpoint},
		{env{EnvOTLPEndpoint: "http://"}, EnvOTLPEndpoint},
		{env{EnvOTLPTracesEndpoint: "ftp://x:1"}, EnvOTLPTracesEndpoint},
		{env{EnvTracesSampler: "jaeger_remote"}, EnvTracesSampler},
		{env{EnvTracesSampler: "traceidratio", EnvTracesSamplerArg: "1.5"}, EnvTracesSamplerArg},
		{env{EnvTracesSampler: "parentbased_traceidratio", EnvTracesSamplerArg: "half"}, EnvTracesSamplerArg},
	}
	for _, c := range cases {
		_, err := readEnv(c.env.get)
		require.Error(t, err, "env %v", c.env)
		require.Contains(t, err.Error(), c.want, "env %v", c.env)

		_, err = Setup(context.Background(), Options{Getenv: c.env.get, NoGlobals: true})
		require.ErrorContains(t, err, c.want)
	}
}

func TestReadEnvReportsAllProblems(t *testing.T) {
	t.Parallel()
	_, err := readEnv(env{EnvOTLPProtocol: "x", EnvTracesSampler: "y", EnvSDKDisabled: "z"}.get)
	require.ErrorContains(t, err, EnvOTLPProtocol)
	require.ErrorContains(t, err, EnvTracesSampler)
	require.ErrorContains(t, err, EnvSDKDisabled)
}

func TestReadEnvDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := readEnv(env{}.get)
	require.NoError(t, err)
	require.False(t, cfg.disabled)
	require.Empty(t, cfg.exporters, "no exporter without configuration")
	require.Equal(t, ProtocolHTTPProtobuf, cfg.protocol)
	require.Empty(t, cfg.endpointURL)
	require.Equal(t, "ParentBased{root:AlwaysOnSampler,remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}", cfg.sampler.Description())
}

func TestReadEnvEndpoints(t *testing.T) {
	t.Parallel()
	cases := []struct {
		env       env
		exporters []string
		url       string
		protocol  string
	}{
		// An endpoint alone turns the otlp exporter on; the generic one gets the signal path.
		{env{EnvOTLPEndpoint: "http://jaeger:4318"}, []string{"otlp"}, "http://jaeger:4318/v1/traces", ProtocolHTTPProtobuf},
		{env{EnvOTLPEndpoint: "http://jaeger:4318/base/"}, []string{"otlp"}, "http://jaeger:4318/base/v1/traces", ProtocolHTTPProtobuf},
		// gRPC takes no path.
		{env{EnvOTLPEndpoint: "http://jaeger:4317", EnvOTLPProtocol: "grpc"}, []string{"otlp"}, "http://jaeger:4317", ProtocolGRPC},
		// The signal-specific endpoint and protocol win and are used as is.
		{env{EnvOTLPEndpoint: "http://a:4318", EnvOTLPTracesEndpoint: "https://b:9999/t", EnvOTLPProtocol: "grpc", EnvOTLPTracesProtocol: "http/protobuf"},
			[]string{"otlp"}, "https://b:9999/t", ProtocolHTTPProtobuf},
		// An explicit exporter list wins over the endpoint's implication.
		{env{EnvOTLPEndpoint: "http://jaeger:4318", EnvTracesExporter: "none"}, nil, "http://jaeger:4318/v1/traces", ProtocolHTTPProtobuf},
		{env{EnvTracesExporter: "console, otlp,console"}, []string{"console", "otlp"}, "", ProtocolHTTPProtobuf},
	}
	for _, c := range cases {
		cfg, err := readEnv(c.env.get)
		require.NoError(t, err, "env %v", c.env)
		require.Equal(t, c.exporters, cfg.exporters, "env %v", c.env)
		require.Equal(t, c.url, cfg.endpointURL, "env %v", c.env)
		require.Equal(t, c.protocol, cfg.protocol, "env %v", c.env)
	}
}

func TestReadEnvSamplers(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"always_on":                     "AlwaysOnSampler",
		"ALWAYS_OFF":                    "AlwaysOffSampler",
		"traceidratio":                  "TraceIDRatioBased{1}",
		"traceidratio:0.25":             "TraceIDRatioBased{0.25}",
		"parentbased_always_off":        "ParentBased{root:AlwaysOffSampler,",
		"parentbased_traceidratio:0.5":  "ParentBased{root:TraceIDRatioBased{0.5},",
		"parentbased_always_on":         "ParentBased{root:AlwaysOnSampler,",
		"parentbased_traceidratio:0":    "ParentBased{root:TraceIDRatioBased{0},",
		"parentbased_traceidratio: 1.0": "ParentBased{root:TraceIDRatioBased{1},",
	}
	for in, want := range cases {
		name, arg, _ := strings.Cut(in, ":")
		cfg, err := readEnv(env{EnvTracesSampler: name, EnvTracesSamplerArg: arg}.get)
		require.NoError(t, err, in)
		require.True(t, strings.HasPrefix(cfg.sampler.Description(), want), "%s: got %s", in, cfg.sampler.Description())
	}
}

func TestSetupNothingConfiguredIsNoop(t *testing.T) {
	t.Parallel()
	tel := setup(t, env{}, Options{})
	require.False(t, tel.TracingEnabled())
	_, span := tracing.Tracer(tel.TracerProvider()).Start(context.Background(), "x")
	require.False(t, span.IsRecording(), "no exporter: spans are no-ops")
	require.False(t, span.SpanContext().IsValid())
	span.End()

	// Metrics still work: the Prometheus exporter is always there.
	c, err := tracing.Meter(tel.MeterProvider()).Int64Counter(tracing.MetricOutboxPublished, metricUnit(tracing.MetricOutboxPublished))
	require.NoError(t, err)
	c.Add(context.Background(), 3)
	body := scrape(t, tel.MetricsHandler())
	require.Contains(t, body, "keiro_outbox_published_total")
	require.Contains(t, body, "go_goroutines")
	require.Contains(t, body, `service_name="keiro"`, "target_info carries the default service name")
}

func TestSetupSDKDisabled(t *testing.T) {
	t.Parallel()
	tel := setup(t, env{EnvSDKDisabled: "TRUE", EnvOTLPEndpoint: "http://127.0.0.1:1", EnvTracesExporter: "console"}, Options{})
	require.False(t, tel.TracingEnabled())
	c, err := tracing.Meter(tel.MeterProvider()).Int64Counter(tracing.MetricOutboxPublished)
	require.NoError(t, err)
	c.Add(context.Background(), 1)
	body := scrape(t, tel.MetricsHandler())
	require.NotContains(t, body, "keiro_outbox_published")
	require.Contains(t, body, "go_goroutines")
}

func TestSetupMetricsExporterNone(t *testing.T) {
	t.Parallel()
	tel := setup(t, env{EnvMetricsExporter: "none"}, Options{})
	c, err := tracing.Meter(tel.MeterProvider()).Int64Counter(tracing.MetricOutboxPublished)
	require.NoError(t, err)
	c.Add(context.Background(), 1)
	require.NotContains(t, scrape(t, tel.MetricsHandler()), "keiro_outbox_published")
}

func TestSetupConsoleExporterAndResource(t *testing.T) {
	t.Parallel()
	var buf testenv.LogBuffer
	tel := setup(t, env{
		EnvTracesExporter:     "console",
		EnvResourceAttributes: "deployment.environment=test,service.name=from-attrs,team=a%20b",
		EnvServiceName:        "relay-from-env",
	}, Options{ServiceName: "from-code", ServiceVersion: "1.2.3", Console: &buf})
	require.True(t, tel.TracingEnabled())
	_, span := tracing.Tracer(tel.TracerProvider()).Start(context.Background(), "send orders")
	require.True(t, span.IsRecording())
	span.End()
	require.NoError(t, tel.Shutdown(context.Background()))
	out := buf.String()
	require.Contains(t, out, `"Name":"send orders"`)
	require.Contains(t, out, `"Value":"relay-from-env"`, "OTEL_SERVICE_NAME wins")
	require.NotContains(t, out, "from-code")
	require.NotContains(t, out, "from-attrs")
	require.Contains(t, out, `"Value":"a b"`, "resource values are percent-decoded")
	require.Contains(t, out, `"Value":"1.2.3"`)
	require.Contains(t, out, `"Value":"test"`)
}

func TestSetupServiceNamePrecedence(t *testing.T) {
	t.Parallel()
	cases := []struct {
		env  env
		opts Options
		want string
	}{
		{env{}, Options{}, DefaultServiceName},
		{env{}, Options{ServiceName: "keiro-relay"}, "keiro-relay"},
		{env{EnvResourceAttributes: "service.name=attrs"}, Options{ServiceName: "keiro-relay"}, "attrs"},
		{env{EnvResourceAttributes: "service.name=attrs", EnvServiceName: "env"}, Options{ServiceName: "keiro-relay"}, "env"},
	}
	for _, c := range cases {
		tel := setup(t, c.env, c.opts)
		c2, err := tracing.Meter(tel.MeterProvider()).Int64Counter("probe")
		require.NoError(t, err)
		c2.Add(context.Background(), 1)
		require.Contains(t, scrape(t, tel.MetricsHandler()), `service_name="`+c.want+`"`)
	}
}

func TestSetupSamplerFromEnv(t *testing.T) {
	t.Parallel()
	var buf testenv.LogBuffer
	tel := setup(t, env{EnvTracesExporter: "console", EnvTracesSampler: "traceidratio", EnvTracesSamplerArg: "0"}, Options{Console: &buf})
	_, span := tracing.Tracer(tel.TracerProvider()).Start(context.Background(), "dropped")
	require.False(t, span.IsRecording(), "ratio 0 samples nothing")
	span.End()
	require.NoError(t, tel.Shutdown(context.Background()))
	require.Empty(t, buf.String())
}

func TestSetupOTLPHTTP(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, variable, suffix, wantPath string
	}{
		{"generic endpoint", EnvOTLPEndpoint, "", "/v1/traces"},
		{"traces endpoint", EnvOTLPTracesEndpoint, "/custom/traces", "/custom/traces"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := make(chan string, 10)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				var req collectortrace.ExportTraceServiceRequest
				if err := proto.Unmarshal(body, &req); err == nil {
					for _, rs := range req.ResourceSpans {
						for _, ss := range rs.ScopeSpans {
							for _, s := range ss.Spans {
								got <- r.URL.Path + " " + s.Name
							}
						}
					}
				}
				w.Header().Set("Content-Type", "application/x-protobuf")
				w.WriteHeader(http.StatusOK)
			}))
			t.Cleanup(srv.Close)
			tel := setup(t, env{c.variable: srv.URL + c.suffix}, Options{})
			require.True(t, tel.TracingEnabled())
			_, span := tracing.Tracer(tel.TracerProvider()).Start(context.Background(), "send orders")
			span.End()
			require.NoError(t, tel.Shutdown(context.Background()), "shutdown flushes the batch")
			require.Equal(t, c.wantPath+" send orders", <-got)
		})
	}
}

// OTEL_METRICS_EXPORTER=otlp pushes keiro's metrics to an OTLP/HTTP receiver, alone or beside
// the Prometheus pull.
func TestSetupOTLPMetricsHTTP(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		env      func(url string) env
		wantPath string
		scraped  bool
	}{
		{"generic endpoint, push only", func(u string) env { return env{EnvMetricsExporter: "otlp", EnvOTLPEndpoint: u} }, "/v1/metrics", false},
		{"metrics endpoint, push and pull", func(u string) env {
			return env{EnvMetricsExporter: "prometheus,otlp", EnvOTLPMetricsEndpoint: u + "/custom/metrics"}
		}, "/custom/metrics", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := make(chan string, 100)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				var req collectormetrics.ExportMetricsServiceRequest
				if err := proto.Unmarshal(body, &req); err == nil {
					for _, rm := range req.ResourceMetrics {
						for _, sm := range rm.ScopeMetrics {
							for _, m := range sm.Metrics {
								for _, dp := range m.GetSum().GetDataPoints() {
									for _, kv := range dp.Attributes {
										got <- fmt.Sprintf("%s %s %s=%s %d", r.URL.Path, m.Name, kv.Key, kv.Value.GetStringValue(), dp.GetAsInt())
									}
								}
							}
						}
					}
				}
				w.Header().Set("Content-Type", "application/x-protobuf")
				w.WriteHeader(http.StatusOK)
			}))
			t.Cleanup(srv.Close)
			tel := setup(t, c.env(srv.URL), Options{})
			published, err := tracing.Meter(tel.MeterProvider()).Int64Counter(tracing.MetricOutboxPublished)
			require.NoError(t, err)
			published.Add(context.Background(), 3, metric.WithAttributes(tracing.DestinationKey.String("orders")))
			require.Equal(t, c.scraped, strings.Contains(scrape(t, tel.MetricsHandler()), "keiro_outbox_published_total"), "pulled on /metrics")
			require.NoError(t, tel.Shutdown(context.Background()), "shutdown pushes the last collection")
			require.Equal(t, c.wantPath+" keiro.outbox.published messaging.destination.name=orders 3", <-got)
		})
	}
}

type traceCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	spans chan string
}

func (c *traceCollector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans <- ss.Scope.GetName() + " " + s.Name
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func TestSetupOTLPGRPC(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	col := &traceCollector{spans: make(chan string, 10)}
	collectortrace.RegisterTraceServiceServer(srv, col)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })

	tel := setup(t, env{EnvOTLPEndpoint: "http://" + lis.Addr().String(), EnvOTLPProtocol: "grpc"}, Options{})
	_, span := tracing.Tracer(tel.TracerProvider()).Start(context.Background(), "process orders")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, tel.Shutdown(ctx))
	require.Equal(t, tracing.ScopeName+" process orders", <-col.spans)
}

// TestSetupOTLPUnreachable is not parallel: it replaces the global otel error handler. A
// collector outage must not fail or block the application: the batch processor drops the spans
// and reports through otel's error handler (logged by default).
func TestSetupOTLPUnreachable(t *testing.T) {
	prev := otel.GetErrorHandler()
	t.Cleanup(func() { otel.SetErrorHandler(prev) })
	errs := make(chan error, 10)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		select {
		case errs <- err:
		default:
		}
	}))

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close()) // nothing listens there any more
	tel := setup(t, env{EnvOTLPEndpoint: "http://" + addr}, Options{})
	_, span := tracing.Tracer(tel.TracerProvider()).Start(context.Background(), "lost")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, tel.Shutdown(ctx))
	require.ErrorContains(t, <-errs, "connection refused")
}

// TestSetupInstallsGlobals is not parallel: it replaces the otel globals and restores them.
func TestSetupInstallsGlobals(t *testing.T) {
	prevTP, prevMP, prevProp := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetMeterProvider(prevMP)
		otel.SetTextMapPropagator(prevProp)
	})

	// Nothing configured: the propagator and meter provider are installed, no tracer provider.
	tel, err := Setup(context.Background(), Options{Getenv: env{}.get})
	require.NoError(t, err)
	require.Equal(t, prevTP, otel.GetTracerProvider())
	require.ElementsMatch(t, []string{"traceparent", "tracestate", "baggage"}, otel.GetTextMapPropagator().Fields())
	c, err := tracing.Meter(nil).Int64Counter(tracing.MetricInboxProcessed)
	require.NoError(t, err)
	c.Add(context.Background(), 1)
	require.Contains(t, scrape(t, tel.MetricsHandler()), "keiro_inbox_processed_total")
	require.NoError(t, tel.Shutdown(context.Background()))

	var buf testenv.LogBuffer
	tel, err = Setup(context.Background(), Options{Getenv: env{EnvTracesExporter: "console"}.get, Console: &buf})
	require.NoError(t, err)
	_, span := tracing.Tracer(nil).Start(context.Background(), "global")
	require.True(t, span.IsRecording())
	require.Equal(t, trace.SpanKindInternal.String(), "internal")
	span.End()
	require.NoError(t, tel.Shutdown(context.Background()))
	require.Contains(t, buf.String(), `"Name":"global"`)
}

func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	return rec.Body.String()
}
