package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/outbox/internal/publish"
	"github.com/keiro-go/keiro/tracing"
)

// scope is the OpenTelemetry instrumentation scope of every keiro instrument and span.
const scope = tracing.ScopeName

// instruments are the outbox's metrics (names per tracing.MetricNames). Every attribute is
// bounded: source, destination, outcome, error type; never ids or keys.
type instruments struct {
	enqueued     metric.Int64Counter
	retried      metric.Int64Counter
	deadlettered metric.Int64Counter
	rejected     metric.Int64Counter
	reclaimed    metric.Int64Counter
	orderBroken  metric.Int64Counter
	backlog      metric.Int64ObservableGauge
	oldestAge    metric.Float64ObservableGauge
	dead         metric.Int64ObservableGauge
	batchSize    metric.Int64Histogram

	meter metric.Meter

	mu        sync.Mutex
	gaugeSeen map[string]bool // destinations with a gauge sampled, to report them 0 once drained
	// sample is the relay's latest gauge sample, observed at each collection; nil when its latest
	// maintenance pass did not sample (another relay did) or the relay stopped, and then the
	// outbox-wide gauges are not exported by this relay. sampledAt is when it was taken.
	sample    []destGauges
	sampledAt time.Time
}

func newInstruments(mp metric.MeterProvider) (*instruments, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(tracing.ScopeName)
	in := &instruments{meter: m, gaugeSeen: map[string]bool{}}
	var errs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	in.enqueued = counter(tracing.MetricOutboxEnqueued, "Events given to EnqueueTx, by source and outcome (inserted, duplicate, conflict).", "{event}")
	in.retried = counter(tracing.MetricOutboxRetried, "Outbox rows whose publish failed and that will be retried.", "{event}")
	in.deadlettered = counter(tracing.MetricOutboxDeadlettered, "Outbox rows that exhausted their attempts and went dead.", "{event}")
	in.rejected = counter(tracing.MetricOutboxRejected, "Outbox rows Kafka refused permanently (rejected).", "{event}")
	in.reclaimed = counter(tracing.MetricOutboxReclaimed, "Outbox rows re-claimed after their lease expired.", "{event}")
	in.orderBroken = counter(tracing.MetricOutboxOrderBroken, "Outbox rows Kafka acknowledged after an earlier row of their key failed in the same flush (should stay 0).", "{event}")
	var err error
	in.backlog, err = m.Int64ObservableGauge(tracing.MetricOutboxBacklog, metric.WithDescription("Outbox rows pending, failed or publishing."), metric.WithUnit("{event}"))
	errs = append(errs, err)
	in.oldestAge, err = m.Float64ObservableGauge(tracing.MetricOutboxOldestPending, metric.WithDescription("Age of the oldest pending or failed outbox row."), metric.WithUnit("s"))
	errs = append(errs, err)
	in.dead, err = m.Int64ObservableGauge(tracing.MetricOutboxDead, metric.WithDescription("Outbox rows dead or rejected, kept for operators."), metric.WithUnit("{event}"))
	errs = append(errs, err)
	in.batchSize, err = m.Int64Histogram(tracing.MetricOutboxBatchSize, metric.WithDescription("Rows per claimed batch."), metric.WithUnit("{event}"),
		metric.WithExplicitBucketBoundaries(tracing.BatchSizeBuckets...))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("create outbox instruments: %w", err)
	}
	return in, nil
}

// destGauges are one destination's sampled gauges.
type destGauges struct {
	destination string
	backlog     int64
	oldestAge   float64 // seconds
	dead        int64
}

// observeGauges registers the callback that exports the relay's latest gauge sample at each
// collection (a relay calls it once; a Store's instruments never observe the gauges).
func (in *instruments) observeGauges(fresh time.Duration) error {
	_, err := in.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		in.mu.Lock()
		defer in.mu.Unlock()
		if in.sample == nil || time.Since(in.sampledAt) > fresh {
			return nil // another relay samples, or this one stopped sampling: export nothing
		}
		for _, g := range in.sample {
			attrs := publish.DestinationAttr(g.destination)
			o.ObserveInt64(in.backlog, g.backlog, attrs)
			o.ObserveFloat64(in.oldestAge, g.oldestAge, attrs)
			o.ObserveInt64(in.dead, g.dead, attrs)
		}
		return nil
	}, in.backlog, in.oldestAge, in.dead)
	return err
}

// recordGauges keeps the sampled gauges per destination for the next collections, with 0 for
// the destinations sampled before that have no open or dead row any more (a drained
// destination must not keep alerting, and its series reads 0 rather than vanishing).
func (in *instruments) recordGauges(gs []destGauges) {
	in.mu.Lock()
	defer in.mu.Unlock()
	now := map[string]bool{}
	sample := make([]destGauges, 0, len(in.gaugeSeen)+len(gs))
	for _, g := range gs {
		now[g.destination] = true
		in.gaugeSeen[g.destination] = true
		sample = append(sample, g)
	}
	for d := range in.gaugeSeen {
		if !now[d] {
			sample = append(sample, destGauges{destination: d})
		}
	}
	in.sample, in.sampledAt = sample, time.Now()
}

// forgetGauges stops the export of the gauges until the relay samples again: its latest pass
// did not sample (another relay took the maintenance lock, or the pass failed), or it stopped.
// Only a relay that sampled exports the outbox-wide gauges, so none keeps exporting an old sample.
func (in *instruments) forgetGauges() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.sample = nil
}
