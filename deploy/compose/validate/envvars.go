package validate

import "github.com/keiro-go/keiro/tracing/otelsetup"

// RelayEnv lists the KEIRO_* environment variables cmd/relay reads.
var RelayEnv = []string{
	"KEIRO_RELAY_DATABASE_URL",
	"KEIRO_RELAY_BROKERS",
	"KEIRO_RELAY_SCHEMA",
	"KEIRO_RELAY_HTTP_ADDR",
	"KEIRO_RELAY_MIGRATE",
}

// ConsumerEnv lists the KEIRO_* environment variables cmd/consumer reads.
var ConsumerEnv = []string{
	"KEIRO_CONSUMER_DATABASE_URL",
	"KEIRO_CONSUMER_BROKERS",
	"KEIRO_CONSUMER_SCHEMA",
	"KEIRO_CONSUMER_GROUP",
	"KEIRO_CONSUMER_NAME",
	"KEIRO_CONSUMER_TOPICS",
	"KEIRO_CONSUMER_HANDLER",
	"KEIRO_CONSUMER_SQL_FUNCTION",
	"KEIRO_CONSUMER_HTTP_ADDR",
	"KEIRO_CONSUMER_MIGRATE",
	"KEIRO_CONSUMER_SCHEMA_REGISTRY_URL",
}

// OTelEnv lists the OpenTelemetry SDK environment variables the binaries honour (read by
// otelsetup.Setup).
var OTelEnv = []string{
	otelsetup.EnvSDKDisabled,
	otelsetup.EnvServiceName,
	otelsetup.EnvResourceAttributes,
	otelsetup.EnvTracesExporter,
	otelsetup.EnvMetricsExporter,
	otelsetup.EnvOTLPEndpoint,
	otelsetup.EnvOTLPTracesEndpoint,
	otelsetup.EnvOTLPProtocol,
	otelsetup.EnvOTLPTracesProtocol,
	otelsetup.EnvOTLPMetricsEndpoint,
	otelsetup.EnvOTLPMetricsProtocol,
	otelsetup.EnvMetricExportInterval,
	otelsetup.EnvMetricExportTimeout,
	otelsetup.EnvTracesSampler,
	otelsetup.EnvTracesSamplerArg,
}

// AllowedEnv maps each compose service built from the repository's Dockerfile (by its build
// target) to the KEIRO_* variables its binary reads. A KEIRO_* variable outside the list is a
// typo or a removed flag.
var AllowedEnv = map[string][]string{
	"relay":    RelayEnv,
	"consumer": ConsumerEnv,
}

// RequiredEnv maps each build target to the KEIRO_* variables without which its binary refuses
// to start.
var RequiredEnv = map[string][]string{
	"relay":    {"KEIRO_RELAY_DATABASE_URL", "KEIRO_RELAY_BROKERS"},
	"consumer": {"KEIRO_CONSUMER_DATABASE_URL", "KEIRO_CONSUMER_BROKERS", "KEIRO_CONSUMER_GROUP", "KEIRO_CONSUMER_TOPICS", "KEIRO_CONSUMER_HANDLER"},
}
