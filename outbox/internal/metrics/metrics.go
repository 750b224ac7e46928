// Package metrics holds the outbox's OpenTelemetry instruments, shared by the producer's
// Store and the relay, and the relay's latest sample of the outbox-wide gauges.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
	"github.com/keiro-go/keiro/outbox/internal/publish"
	"github.com/keiro-go/keiro/tracing"
)

// Instruments are the outbox's metrics (names per tracing.MetricNames). Every attribute is
// bounded: source, destination, outcome, error type; never ids or keys.
type Instruments struct {
	// Enqueued counts the events given to EnqueueTx; Retried, Deadlettered, Rejected,
	// Reclaimed and OrderBroken the relay's row transitions; BatchSize the rows per claim.
	Enqueued     metric.Int64Counter
	Retried      metric.Int64Counter
	Deadlettered metric.Int64Counter
	Rejected     metric.Int64Counter
	Reclaimed    metric.Int64Counter
	OrderBroken  metric.Int64Counter
	BatchSize    metric.Int64Histogram

	transactions metric.Int64ObservableCounter
	fenced       metric.Int64ObservableCounter

	backlog   metric.Int64ObservableGauge
	oldestAge metric.Float64ObservableGauge
	dead      metric.Int64ObservableGauge

	meter metric.Meter

	mu        sync.Mutex
	gaugeSeen map[string]bool // destinations with a gauge sampled, to report them 0 once drained
	// sample is the relay's latest gauge sample, observed at each collection; nil when its latest
	// maintenance pass did not sample (another relay did) or the relay stopped, and then the
	// outbox-wide gauges are not exported by this relay. sampledAt is when it was taken.
	sample    []DestGauges
	sampledAt time.Time
}

// New returns the outbox's instruments on mp's meter (the global provider when mp is nil).
func New(mp metric.MeterProvider) (*Instruments, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(tracing.ScopeName)
	in := &Instruments{meter: m, gaugeSeen: map[string]bool{}}
	var errs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	in.Enqueued = counter(tracing.MetricOutboxEnqueued, "Events given to EnqueueTx, by source and outcome (inserted, duplicate, conflict).", "{event}")
	in.Retried = counter(tracing.MetricOutboxRetried, "Outbox rows whose publish failed and that will be retried.", "{event}")
	in.Deadlettered = counter(tracing.MetricOutboxDeadlettered, "Outbox rows that exhausted their attempts and went dead.", "{event}")
	in.Rejected = counter(tracing.MetricOutboxRejected, "Outbox rows Kafka refused permanently (rejected).", "{event}")
	in.Reclaimed = counter(tracing.MetricOutboxReclaimed, "Outbox rows re-claimed after their lease expired.", "{event}")
	in.OrderBroken = counter(tracing.MetricOutboxOrderBroken, "Outbox rows Kafka acknowledged after an earlier row of their key failed in the same flush (should stay 0).", "{event}")
	var err error
	in.backlog, err = m.Int64ObservableGauge(tracing.MetricOutboxBacklog, metric.WithDescription("Outbox rows pending, failed or publishing."), metric.WithUnit("{event}"))
	errs = append(errs, err)
	in.oldestAge, err = m.Float64ObservableGauge(tracing.MetricOutboxOldestPending, metric.WithDescription("Age of the oldest pending or failed outbox row."), metric.WithUnit("s"))
	errs = append(errs, err)
	in.dead, err = m.Int64ObservableGauge(tracing.MetricOutboxDead, metric.WithDescription("Outbox rows dead or rejected, kept for operators."), metric.WithUnit("{event}"))
	errs = append(errs, err)
	in.transactions, err = m.Int64ObservableCounter(tracing.MetricOutboxTransactions, metric.WithDescription("Kafka transactions of an exactly-once relay, by outcome: committed, aborted."), metric.WithUnit("{transaction}"))
	errs = append(errs, err)
	in.fenced, err = m.Int64ObservableCounter(tracing.MetricOutboxFenced, metric.WithDescription("Times an exactly-once relay found its transactional id taken over by a newer relay."), metric.WithUnit("{fence}"))
	errs = append(errs, err)
	in.BatchSize, err = m.Int64Histogram(tracing.MetricOutboxBatchSize, metric.WithDescription("Rows per claimed batch."), metric.WithUnit("{event}"),
		metric.WithExplicitBucketBoundaries(tracing.BatchSizeBuckets...))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("create outbox instruments: %w", err)
	}
	return in, nil
}

// ObserveTransactions registers the callback that exports the transactions of an
// exactly-once relay from c, its engines' counters (a relay calls it once, with ExactlyOnce).
func (in *Instruments) ObserveTransactions(c *exactlyonce.Counters) error {
	committed := metric.WithAttributeSet(attribute.NewSet(tracing.OutcomeKey.String("committed")))
	aborted := metric.WithAttributeSet(attribute.NewSet(tracing.OutcomeKey.String("aborted")))
	_, err := in.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(in.transactions, c.Committed(), committed)
		o.ObserveInt64(in.transactions, c.Aborted(), aborted)
		o.ObserveInt64(in.fenced, c.Fenced())
		return nil
	}, in.transactions, in.fenced)
	return err
}

// DestGauges are one destination's sampled gauges.
type DestGauges struct {
	// Destination is the topic; Backlog its open rows, OldestAge the age of its oldest
	// pending or failed row and Dead its dead or rejected rows.
	Destination string
	Backlog     int64
	OldestAge   float64 // seconds
	Dead        int64
}

// ObserveGauges registers the callback that exports the relay's latest gauge sample at each
// collection (a relay calls it once; a Store's instruments never observe the gauges).
func (in *Instruments) ObserveGauges(fresh time.Duration) error {
	_, err := in.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		in.mu.Lock()
		defer in.mu.Unlock()
		if in.sample == nil || time.Since(in.sampledAt) > fresh {
			return nil // another relay samples, or this one stopped sampling: export nothing
		}
		for _, g := range in.sample {
			attrs := publish.DestinationAttr(g.Destination)
			o.ObserveInt64(in.backlog, g.Backlog, attrs)
			o.ObserveFloat64(in.oldestAge, g.OldestAge, attrs)
			o.ObserveInt64(in.dead, g.Dead, attrs)
		}
		return nil
	}, in.backlog, in.oldestAge, in.dead)
	return err
}

// RecordGauges keeps the sampled gauges per destination for the next collections, with 0 for
// the destinations sampled before that have no open or dead row any more (a drained
// destination must not keep alerting, and its series reads 0 rather than vanishing).
func (in *Instruments) RecordGauges(gs []DestGauges) {
	in.mu.Lock()
	defer in.mu.Unlock()
	now := map[string]bool{}
	sample := make([]DestGauges, 0, len(in.gaugeSeen)+len(gs))
	for _, g := range gs {
		now[g.Destination] = true
		in.gaugeSeen[g.Destination] = true
		sample = append(sample, g)
	}
	for d := range in.gaugeSeen {
		if !now[d] {
			sample = append(sample, DestGauges{Destination: d})
		}
	}
	in.sample, in.sampledAt = sample, time.Now()
}

// ForgetGauges stops the export of the gauges until the relay samples again: its latest pass
// did not sample (another relay took the maintenance lock, or the pass failed), or it stopped.
// Only a relay that sampled exports the outbox-wide gauges, so none keeps exporting an old sample.
func (in *Instruments) ForgetGauges() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.sample = nil
}
