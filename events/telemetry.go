package events

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// instrumentationScope is the OpenTelemetry scope of every span and instrument of the package.
const instrumentationScope = "keiro"

// metrics are the store's and command runners' instruments. Data points carry no attributes
// except the bounded subscription name on keiro.projection.lag.
type metrics struct {
	conflicts, retries, duplicates metric.Int64Counter
	snapshotWriteFailures          metric.Int64Counter
	snapshotEncodeFailures         metric.Int64Counter
	snapshotDecodeFailures         metric.Int64Counter
	snapshotHits, snapshotMisses   metric.Int64Counter
	snapshotApplyDivergence        metric.Int64Counter
	dispatchPoison, dispatchFailed metric.Int64Counter
	dispatchDuplicates             metric.Int64Counter
	dispatchDeadLettered           metric.Int64Counter
	meter                          metric.Meter
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := &metrics{meter: mp.Meter(instrumentationScope)}
	var errs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := m.meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		if err != nil {
			errs = append(errs, fmt.Errorf("create instrument %s: %w", name, err))
		}
		return c
	}
	m.conflicts = counter("keiro.command.conflicts", "Appends of a command that met a version conflict.", "{conflict}")
	m.retries = counter("keiro.command.retries", "Command attempts retried after a conflict.", "{retry}")
	m.duplicates = counter("keiro.command.duplicates", "Appends whose event ids were already stored (idempotent repeats and id conflicts).", "{append}")
	m.snapshotWriteFailures = counter("keiro.snapshot.write.failures", "Advisory snapshot writes that failed (the command or workflow step is committed).", "{failure}")
	m.snapshotEncodeFailures = counter("keiro.snapshot.encode.failures", "Advisory snapshots whose state could not be encoded (the command or workflow step is committed).", "{failure}")
	m.snapshotDecodeFailures = counter("keiro.snapshot.decode.failures", "Stored snapshots that could not be decoded (the stream or journal was read in full).", "{failure}")
	m.snapshotHits = counter("keiro.snapshot.read.hits", "Snapshot lookups that seeded a hydration.", "{read}")
	m.snapshotMisses = counter("keiro.snapshot.read.misses", "Snapshot lookups without a usable snapshot (absent, other state version or shape, undecodable).", "{read}")
	m.snapshotApplyDivergence = counter("keiro.snapshot.apply.divergence", "Just-appended event batches that did not replay to the decided state; no snapshot was written, and the next hydration sees what the log holds.", "{failure}")
	m.dispatchPoison = counter("keiro.dispatch.poison", "Router and process manager inputs that could not be decoded.", "{input}")
	m.dispatchFailed = counter("keiro.dispatch.failed", "Routed and process manager commands (and resolves) that failed.", "{command}")
	m.dispatchDuplicates = counter("keiro.dispatch.duplicates", "Routed and process manager commands an earlier delivery had already dispatched.", "{command}")
	m.dispatchDeadLettered = counter("keiro.dispatch.deadlettered", "Rejected commands set aside under RejectedDeadLetter or RejectedSkip.", "{command}")
	return m, errors.Join(errs...)
}
