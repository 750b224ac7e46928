package workflow

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// instrumentationScope is the OpenTelemetry scope of the package's spans and instruments.
const instrumentationScope = "keiro"

// Span attribute keys (keiro's).
const (
	attrName = "keiro.workflow.name"
	attrID   = "keiro.workflow.id"
	attrStep = "keiro.workflow.step"
)

// telemetry holds keiro's keiro.workflow.* instruments.
type telemetry struct {
	executed, replayed, resumed, failed, resumeErrors, leaseSkipped, started metric.Int64Counter
	journal, journalRead                                                     metric.Int64Histogram
	// The event store's keiro.snapshot.* instruments (same names, descriptions and units).
	snapshotWriteFailures, snapshotEncodeFailures, snapshotDecodeFailures metric.Int64Counter
	snapshotHits, snapshotMisses                                          metric.Int64Counter
	pending                                                               metric.Int64Gauge
	active                                                                metric.Int64UpDownCounter
}

func newTelemetry(mp metric.MeterProvider) (*telemetry, error) {
	m := mp.Meter(instrumentationScope)
	var errs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		if err != nil {
			errs = append(errs, fmt.Errorf("create instrument %s: %w", name, err))
		}
		return c
	}
	t := &telemetry{
		executed:     counter("keiro.workflow.steps.executed", "Workflow steps that ran and were journaled.", "{step}"),
		replayed:     counter("keiro.workflow.steps.replayed", "Workflow steps answered from the journal without running.", "{step}"),
		resumed:      counter("keiro.workflow.resumed", "Workflow runs started by a worker.", "{run}"),
		failed:       counter("keiro.workflow.failed", "Workflow instances that failed (attempts ran out).", "{workflow}"),
		resumeErrors: counter("keiro.workflow.resume.errors", "Worker passes or runs that failed on the database.", "{error}"),
		leaseSkipped: counter("keiro.workflow.lease.skipped", "Runnable instances a worker skipped because another live owner leases them.", "{workflow}"),
		started:      counter("keiro.workflow.started", "Workflow instances started.", "{workflow}"),

		snapshotWriteFailures:  counter("keiro.snapshot.write.failures", "Advisory snapshot writes that failed (the command or workflow step is committed).", "{failure}"),
		snapshotEncodeFailures: counter("keiro.snapshot.encode.failures", "Advisory snapshots whose state could not be encoded (the command or workflow step is committed).", "{failure}"),
		snapshotDecodeFailures: counter("keiro.snapshot.decode.failures", "Stored snapshots that could not be decoded (the stream or journal was read in full).", "{failure}"),
		snapshotHits:           counter("keiro.snapshot.read.hits", "Snapshot lookups that seeded a hydration.", "{read}"),
		snapshotMisses:         counter("keiro.snapshot.read.misses", "Snapshot lookups without a usable snapshot (absent, other state version or shape, undecodable).", "{read}"),
	}
	var err error
	if t.journal, err = m.Int64Histogram("keiro.workflow.journal.length", metric.WithDescription("Journal entries of a completed run."), metric.WithUnit("{step}")); err != nil {
		errs = append(errs, err)
	}
	if t.journalRead, err = m.Int64Histogram("keiro.workflow.journal.read", metric.WithDescription("Journal rows a run read to hydrate: the tail after a snapshot, or the whole generation."), metric.WithUnit("{step}")); err != nil {
		errs = append(errs, err)
	}
	if t.pending, err = m.Int64Gauge("keiro.workflow.awakeables.pending", metric.WithDescription("Awakeables not resolved yet."), metric.WithUnit("{awakeable}")); err != nil {
		errs = append(errs, err)
	}
	if t.active, err = m.Int64UpDownCounter("keiro.workflow.active", metric.WithDescription("Workflow runs in progress in this process."), metric.WithUnit("{run}")); err != nil {
		errs = append(errs, err)
	}
	return t, errors.Join(errs...)
}
