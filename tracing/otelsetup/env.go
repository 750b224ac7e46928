package otelsetup

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The OTEL_* environment variables [Setup] reads (see [Setup] for their values).
const (
	// EnvSDKDisabled is OTEL_SDK_DISABLED: true turns every signal into a no-op.
	EnvSDKDisabled = "OTEL_SDK_DISABLED"
	// EnvServiceName is OTEL_SERVICE_NAME, the service.name resource attribute.
	EnvServiceName = "OTEL_SERVICE_NAME"
	// EnvResourceAttributes is OTEL_RESOURCE_ATTRIBUTES: key=value,... (values percent-encoded).
	EnvResourceAttributes = "OTEL_RESOURCE_ATTRIBUTES"
	// EnvTracesExporter is OTEL_TRACES_EXPORTER: none, otlp, console (comma-separated).
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	// EnvMetricsExporter is OTEL_METRICS_EXPORTER: prometheus, otlp (comma-separated, both
	// allowed) or none.
	EnvMetricsExporter = "OTEL_METRICS_EXPORTER"
	// EnvOTLPEndpoint is OTEL_EXPORTER_OTLP_ENDPOINT, the base URL of the OTLP receiver.
	EnvOTLPEndpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
	// EnvOTLPTracesEndpoint is OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, the full traces URL.
	EnvOTLPTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	// EnvOTLPProtocol is OTEL_EXPORTER_OTLP_PROTOCOL: grpc or http/protobuf.
	EnvOTLPProtocol = "OTEL_EXPORTER_OTLP_PROTOCOL"
	// EnvOTLPTracesProtocol is OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, overriding EnvOTLPProtocol.
	EnvOTLPTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	// EnvOTLPMetricsEndpoint is OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, the full metrics URL.
	EnvOTLPMetricsEndpoint = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
	// EnvOTLPMetricsProtocol is OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, overriding EnvOTLPProtocol.
	EnvOTLPMetricsProtocol = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
	// EnvMetricExportInterval is OTEL_METRIC_EXPORT_INTERVAL: milliseconds between OTLP metric
	// pushes (60000 by default), read by the SDK's periodic reader.
	EnvMetricExportInterval = "OTEL_METRIC_EXPORT_INTERVAL"
	// EnvMetricExportTimeout is OTEL_METRIC_EXPORT_TIMEOUT: milliseconds one OTLP metric push
	// may take (30000 by default), read by the SDK's periodic reader.
	EnvMetricExportTimeout = "OTEL_METRIC_EXPORT_TIMEOUT"
	// EnvTracesSampler is OTEL_TRACES_SAMPLER.
	EnvTracesSampler = "OTEL_TRACES_SAMPLER"
	// EnvTracesSamplerArg is OTEL_TRACES_SAMPLER_ARG, the ratio of the traceidratio samplers.
	EnvTracesSamplerArg = "OTEL_TRACES_SAMPLER_ARG"
)

// OTLP protocols.
const (
	// ProtocolGRPC is OTLP over gRPC (conventionally port 4317).
	ProtocolGRPC = "grpc"
	// ProtocolHTTPProtobuf is OTLP over HTTP with protobuf bodies (conventionally port 4318).
	ProtocolHTTPProtobuf = "http/protobuf"
	// DefaultOTLPProtocol is the protocol used when neither protocol variable is set, as the
	// OTLP exporter specification recommends.
	DefaultOTLPProtocol = ProtocolHTTPProtobuf

	defaultOTLPTracesURLPath  = "/v1/traces"
	defaultOTLPMetricsURLPath = "/v1/metrics"
)

// envConfig is the validated reading of the OTEL_* variables.
type envConfig struct {
	disabled        bool
	serviceName     string
	resourceAttrs   []attribute.KeyValue
	exporters       []string // subset of otlp, console; empty means no tracer provider
	metricsDisabled bool
	protocol        string
	endpointURL     string // full URL including the traces path; "" means the exporter's default
	sampler         sdktrace.Sampler

	metricsPrometheus  bool   // serve metrics on /metrics (pull)
	metricsOTLP        bool   // push metrics to an OTLP receiver
	metricsProtocol    string // grpc or http/protobuf
	metricsEndpointURL string // full URL including the metrics path; "" means the exporter's default
}

// readEnv reads and validates the OTEL_* variables through getenv, returning every problem at
// once, each naming its variable.
func readEnv(getenv func(string) string) (envConfig, error) {
	var cfg envConfig
	var errs []error
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }

	switch v := strings.ToLower(get(EnvSDKDisabled)); v {
	case "", "false":
	case "true":
		cfg.disabled = true
	default:
		errs = append(errs, fmt.Errorf("%s=%q: want true or false", EnvSDKDisabled, v))
	}

	cfg.serviceName = get(EnvServiceName)

	attrs, attrErrs := parseResourceAttributes(get(EnvResourceAttributes))
	for _, err := range attrErrs {
		errs = append(errs, fmt.Errorf("%s: %w", EnvResourceAttributes, err))
	}
	cfg.resourceAttrs = attrs

	endpointVar, endpoint := EnvOTLPTracesEndpoint, get(EnvOTLPTracesEndpoint)
	if endpoint == "" {
		endpointVar, endpoint = EnvOTLPEndpoint, get(EnvOTLPEndpoint)
	}

	exporters := get(EnvTracesExporter)
	if exporters == "" && endpoint != "" {
		exporters = "otlp"
	}
	for e := range strings.SplitSeq(exporters, ",") {
		switch e = strings.ToLower(strings.TrimSpace(e)); e {
		case "":
		case "none":
			if exporters != "none" {
				errs = append(errs, fmt.Errorf("%s=%q: none cannot be combined with other exporters", EnvTracesExporter, exporters))
			}
		case "otlp", "console":
			if !slices.Contains(cfg.exporters, e) {
				cfg.exporters = append(cfg.exporters, e)
			}
		default:
			errs = append(errs, fmt.Errorf("%s: unknown exporter %q: want none, otlp or console", EnvTracesExporter, e))
		}
	}

	metricsExporters := strings.ToLower(get(EnvMetricsExporter))
	if metricsExporters == "" {
		metricsExporters = "prometheus"
	}
	for e := range strings.SplitSeq(metricsExporters, ",") {
		switch e = strings.TrimSpace(e); e {
		case "prometheus":
			cfg.metricsPrometheus = true
		case "otlp":
			cfg.metricsOTLP = true
		case "none":
			if metricsExporters != "none" {
				errs = append(errs, fmt.Errorf("%s=%q: none cannot be combined with other exporters", EnvMetricsExporter, metricsExporters))
			}
			cfg.metricsDisabled = true
		default:
			errs = append(errs, fmt.Errorf("%s: unknown exporter %q: want prometheus (served on /metrics), otlp (pushed to the OTLP endpoint) or none", EnvMetricsExporter, e))
		}
	}

	var perr error
	cfg.metricsProtocol, perr = otlpProtocol(get, EnvOTLPMetricsProtocol)
	if perr != nil && cfg.metricsOTLP && get(EnvOTLPMetricsProtocol) != "" {
		errs = append(errs, perr)
	}
	if cfg.metricsOTLP {
		mURL, err := otlpEndpoint(get, EnvOTLPMetricsEndpoint, cfg.metricsProtocol, defaultOTLPMetricsURLPath)
		if err != nil && get(EnvOTLPMetricsEndpoint) != "" { // the generic endpoint's error is reported with the traces'
			errs = append(errs, err)
		}
		cfg.metricsEndpointURL = mURL
	}

	protoVar, proto := EnvOTLPTracesProtocol, get(EnvOTLPTracesProtocol)
	if proto == "" {
		protoVar, proto = EnvOTLPProtocol, get(EnvOTLPProtocol)
	}
	switch proto {
	case "":
		cfg.protocol = DefaultOTLPProtocol
	case ProtocolGRPC, ProtocolHTTPProtobuf:
		cfg.protocol = proto
	case "http/json":
		errs = append(errs, fmt.Errorf("%s=%q: not supported by the Go exporters; use grpc or http/protobuf", protoVar, proto))
	default:
		errs = append(errs, fmt.Errorf("%s=%q: unknown protocol; want grpc or http/protobuf", protoVar, proto))
	}

	if endpoint != "" {
		u, err := url.Parse(endpoint)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s=%q: %w", endpointVar, endpoint, err))
		case u.Scheme != "http" && u.Scheme != "https":
			errs = append(errs, fmt.Errorf("%s=%q: want an http:// or https:// URL", endpointVar, endpoint))
		case u.Host == "":
			errs = append(errs, fmt.Errorf("%s=%q: missing host", endpointVar, endpoint))
		default:
			// The signal-specific endpoint is used as is; the generic one gets the traces path
			// appended for OTLP/HTTP (the OTLP exporter specification).
			if endpointVar == EnvOTLPEndpoint && cfg.protocol == ProtocolHTTPProtobuf {
				u.Path = strings.TrimSuffix(u.Path, "/") + defaultOTLPTracesURLPath
			}
			cfg.endpointURL = u.String()
		}
	}

	sampler, err := parseSampler(get(EnvTracesSampler), get(EnvTracesSamplerArg))
	if err != nil {
		errs = append(errs, err)
	}
	cfg.sampler = sampler

	return cfg, errors.Join(errs...)
}

// parseResourceAttributes parses OTEL_RESOURCE_ATTRIBUTES: comma-separated key=value pairs,
// values percent-decoded. It returns one error per malformed pair.
func parseResourceAttributes(s string) ([]attribute.KeyValue, []error) {
	if s == "" {
		return nil, nil
	}
	var attrs []attribute.KeyValue
	var errs []error
	for pair := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			errs = append(errs, fmt.Errorf("%q: want key=value", pair))
			continue
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("%q: %w", pair, err))
			continue
		}
		attrs = append(attrs, attribute.String(k, val))
	}
	return attrs, errs
}

// parseSampler maps OTEL_TRACES_SAMPLER/_ARG to a sampler. Unset means parent-based always-on,
// the SDK default.
func parseSampler(name, arg string) (sdktrace.Sampler, error) {
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		v, err := strconv.ParseFloat(arg, 64)
		if err != nil || v < 0 || v > 1 {
			return 0, fmt.Errorf("%s=%q: want a ratio between 0 and 1 for sampler %s", EnvTracesSamplerArg, arg, name)
		}
		return v, nil
	}
	switch strings.ToLower(name) {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio":
		r, err := ratio()
		return sdktrace.TraceIDRatioBased(r), err
	case "parentbased_traceidratio":
		r, err := ratio()
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), err
	}
	return nil, fmt.Errorf("%s=%q: unsupported sampler; want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio", EnvTracesSampler, name)
}

// otlpProtocol reads the protocol of one signal: its own variable, else the generic one, else
// [DefaultOTLPProtocol].
func otlpProtocol(get func(string) string, signalVar string) (string, error) {
	protoVar, proto := signalVar, get(signalVar)
	if proto == "" {
		protoVar, proto = EnvOTLPProtocol, get(EnvOTLPProtocol)
	}
	switch proto {
	case "":
		return DefaultOTLPProtocol, nil
	case ProtocolGRPC, ProtocolHTTPProtobuf:
		return proto, nil
	case "http/json":
		return DefaultOTLPProtocol, fmt.Errorf("%s=%q: not supported by the Go exporters; use grpc or http/protobuf", protoVar, proto)
	}
	return DefaultOTLPProtocol, fmt.Errorf("%s=%q: unknown protocol; want grpc or http/protobuf", protoVar, proto)
}

// otlpEndpoint reads the endpoint of one signal: its own variable used as is, else the generic
// one with the signal's path appended for http/protobuf (the OTLP exporter specification).
// "" means the exporter's default (localhost).
func otlpEndpoint(get func(string) string, signalVar, protocol, signalPath string) (string, error) {
	endpointVar, endpoint := signalVar, get(signalVar)
	if endpoint == "" {
		endpointVar, endpoint = EnvOTLPEndpoint, get(EnvOTLPEndpoint)
	}
	if endpoint == "" {
		return "", nil
	}
	u, err := url.Parse(endpoint)
	switch {
	case err != nil:
		return "", fmt.Errorf("%s=%q: %w", endpointVar, endpoint, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("%s=%q: want an http:// or https:// URL", endpointVar, endpoint)
	case u.Host == "":
		return "", fmt.Errorf("%s=%q: missing host", endpointVar, endpoint)
	}
	if endpointVar == EnvOTLPEndpoint && protocol == ProtocolHTTPProtobuf {
		u.Path = strings.TrimSuffix(u.Path, "/") + signalPath
	}
	return u.String(), nil
}
