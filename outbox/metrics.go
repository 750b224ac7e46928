package outbox

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// scope is the OpenTelemetry instrumentation scope of every keiro instrument and span.
const scope = "keiro"

// instruments are the outbox's metrics (names per the project's vocabulary). Every attribute
// is bounded: source, destination, outcome; never ids or keys.
type instruments struct {
	enqueued     metric.Int64Counter
	published    metric.Int64Counter
	retried      metric.Int64Counter
	deadlettered metric.Int64Counter
	rejected     metric.Int64Counter
	reclaimed    metric.Int64Counter
	orderBroken  metric.Int64Counter
	backlog      metric.Int64Gauge
	oldestAge    metric.Float64Gauge
	dead         metric.Int64Gauge
	latency      metric.Float64Histogram
	batchSize    metric.Int64Histogram
}

func newInstruments(mp metric.MeterProvider) (*instruments, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(scope)
	var in instruments
	var err error
	counter := func(name, desc, unit string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		return c
	}
	in.enqueued = counter("keiro.outbox.enqueued", "Events given to EnqueueTx, by source and outcome (inserted, duplicate, conflict).", "{event}")
	in.published = counter("keiro.outbox.published", "Outbox rows acknowledged by Kafka and marked sent.", "{event}")
	in.retried = counter("keiro.outbox.retried", "Outbox rows whose publish failed and that will be retried.", "{event}")
	in.deadlettered = counter("keiro.outbox.deadlettered", "Outbox rows that exhausted their attempts and went dead.", "{event}")
	in.rejected = counter("keiro.outbox.rejected", "Outbox rows Kafka refused permanently (rejected).", "{event}")
	in.reclaimed = counter("keiro.outbox.reclaimed", "Outbox rows re-claimed after their lease expired.", "{event}")
	in.orderBroken = counter("keiro.outbox.order_broken", "Outbox rows Kafka acknowledged after an earlier row of their key failed in the same flush (should stay 0).", "{event}")
	if err != nil {
		return nil, err
	}
	if in.backlog, err = m.Int64Gauge("keiro.outbox.backlog", metric.WithDescription("Outbox rows pending, failed or publishing."), metric.WithUnit("{event}")); err != nil {
		return nil, err
	}
	if in.oldestAge, err = m.Float64Gauge("keiro.outbox.oldest_pending.age", metric.WithDescription("Age of the oldest pending or failed outbox row."), metric.WithUnit("s")); err != nil {
		return nil, err
	}
	if in.dead, err = m.Int64Gauge("keiro.outbox.dead", metric.WithDescription("Outbox rows dead or rejected, kept for operators."), metric.WithUnit("{event}")); err != nil {
		return nil, err
	}
	if in.latency, err = m.Float64Histogram("keiro.outbox.publish.latency", metric.WithDescription("Time from the row's creation (enqueue transaction start) to the broker's acknowledgement."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)); err != nil {
		return nil, err
	}
	if in.batchSize, err = m.Int64Histogram("keiro.outbox.batch.size", metric.WithDescription("Rows per claimed batch."), metric.WithUnit("{event}"),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)); err != nil {
		return nil, err
	}
	return &in, nil
}

func destinationAttr(d string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("destination", d)))
}
