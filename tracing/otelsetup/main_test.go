package otelsetup

import (
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.uber.org/goleak"

	"github.com/keiro-go/keiro/tracing"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// metricUnit returns the unit option of the vocabulary metric name.
func metricUnit(name string) metric.InstrumentOption {
	for _, m := range tracing.MetricNames {
		if m.Name == name {
			return metric.WithUnit(m.Unit)
		}
	}
	panic("unknown metric " + name)
}
