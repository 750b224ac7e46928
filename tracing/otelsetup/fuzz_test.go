package otelsetup

import (
	"strings"
	"testing"
)

// FuzzReadEnv feeds arbitrary values to every OTEL_* variable Setup reads: never a panic, and
// every error names the variable it is about.
func FuzzReadEnv(f *testing.F) {
	f.Add("true", "svc", "a=b,c=%20d", "otlp,console", "grpc", "http://jaeger:4317", "traceidratio", "0.5", "none")
	f.Add("", "", "x,y=%zz,=z", "none,otlp", "http/json", "jaeger:4317", "xray", "2", "otlp")
	f.Fuzz(func(t *testing.T, disabled, service, attrs, exporters, protocol, endpoint, sampler, arg, metrics string) {
		env := map[string]string{
			EnvSDKDisabled: disabled, EnvServiceName: service, EnvResourceAttributes: attrs,
			EnvTracesExporter: exporters, EnvOTLPProtocol: protocol, EnvOTLPEndpoint: endpoint,
			EnvTracesSampler: sampler, EnvTracesSamplerArg: arg, EnvMetricsExporter: metrics,
		}
		cfg, err := readEnv(func(k string) string { return env[k] })
		if err != nil {
			for line := range strings.SplitSeq(err.Error(), "\n") {
				if !strings.HasPrefix(line, "OTEL_") {
					t.Fatalf("error line does not name its variable: %q", line)
				}
			}
			return
		}
		if cfg.sampler == nil || (cfg.protocol != ProtocolGRPC && cfg.protocol != ProtocolHTTPProtobuf) {
			t.Fatalf("valid environment gave an incomplete config: %+v", cfg)
		}
	})
}
