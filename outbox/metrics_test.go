package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keiro-go/keiro/internal/advisorylock"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/tracing"
)

// collectMetrics reads reader's current data, by instrument name.
func collectMetrics(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m.Data
		}
	}
	return got
}

// gaugeByDestination returns an int64 or float64 gauge's value per messaging.destination.name.
func gaugeByDestination(t *testing.T, got map[string]metricdata.Aggregation, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	switch g := got[name].(type) {
	case metricdata.Gauge[int64]:
		for _, dp := range g.DataPoints {
			d, _ := dp.Attributes.Value(tracing.DestinationKey)
			out[d.AsString()] = float64(dp.Value)
		}
	case metricdata.Gauge[float64]:
		for _, dp := range g.DataPoints {
			d, _ := dp.Attributes.Value(tracing.DestinationKey)
			out[d.AsString()] = dp.Value
		}
	default:
		t.Fatalf("%s is %T, not a gauge", name, got[name])
	}
	return out
}

// The gauges are per destination, so one bounded context's stuck topic is told apart from
// another's; a destination that drains goes back to 0 rather than keeping its last value (an
// alert on the oldest pending age would otherwise never resolve). The semantic conventions'
// client metrics count every produce with its outcome.
func TestRelayGaugesPerDestinationAndSendMetrics(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := newKafka(t)
	kc.CreateTopic(t, "orders", 1)
	kc.CreateTopic(t, "payments", 1)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	st, err := outbox.NewStore(db.Schema, outbox.StoreOptions{})
	require.NoError(t, err)
	enqueue(t, db.Pool, st, keyedEvents("orders", 2, 2)...)
	enqueue(t, db.Pool, st, event("p-big", "payments", ptr("k"), strings.Repeat("x", 4096)))

	// Before any relay runs: a maintenance pass of an idle relay samples both destinations.
	idle, err := outbox.NewRelay(db.Pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{Schema: db.Schema, MeterProvider: mp, Logger: testLogger(t)})
	require.NoError(t, err)
	res, err := idle.MaintenancePass(context.Background())
	require.NoError(t, err)
	require.True(t, res.Ran)
	require.EqualValues(t, 3, res.Backlog)
	got := collectMetrics(t, reader)
	require.Equal(t, map[string]float64{"orders": 2, "payments": 1}, gaugeByDestination(t, got, tracing.MetricOutboxBacklog))
	require.Equal(t, map[string]float64{"orders": 0, "payments": 0}, gaugeByDestination(t, got, tracing.MetricOutboxDead))
	for d, age := range gaugeByDestination(t, got, tracing.MetricOutboxOldestPending) {
		require.GreaterOrEqual(t, age, 0.0, d)
	}

	// The relay publishes orders and rejects the oversized payment.
	// It stops then (a stopped relay exports no gauge: its sample, taken when it started, is
	// old), and the idle relay samples again.
	p := new(testenv.Progress)
	_, stop, stopped := runRelay(t, db, kc.NewClient(t, outbox.ProducerOpts()...),
		outbox.RelayConfig{OnBatch: onSettled(p), MeterProvider: mp, MaxRecordBytes: 1024, Logger: testLogger(t)})
	p.Wait(t, 3, 30*time.Second, nil)
	stop()
	require.NoError(t, <-stopped)

	res, err = idle.MaintenancePass(context.Background())
	require.NoError(t, err)
	require.True(t, res.Ran)
	got = collectMetrics(t, reader)
	require.Equal(t, map[string]float64{"orders": 0, "payments": 0}, gaugeByDestination(t, got, tracing.MetricOutboxBacklog), "orders drained to 0")
	require.Equal(t, map[string]float64{"orders": 0, "payments": 0}, gaugeByDestination(t, got, tracing.MetricOutboxOldestPending))
	require.Equal(t, map[string]float64{"orders": 0, "payments": 1}, gaugeByDestination(t, got, tracing.MetricOutboxDead), "the rejected payment waits for an operator")

	sent := attribute.NewSet(
		tracing.MessagingSystemKey.String("kafka"),
		tracing.MessagingOperationNameKey.String("send"),
		tracing.DestinationKey.String("orders"))
	var n int64
	for _, dp := range got[tracing.MetricClientSentMessages].(metricdata.Sum[int64]).DataPoints {
		require.True(t, dp.Attributes.Equals(&sent), "only acknowledged sends to orders: %v", dp.Attributes.ToSlice())
		n += dp.Value
	}
	require.EqualValues(t, 2, n)
	dur := got[tracing.MetricClientOperationDuration].(metricdata.Histogram[float64])
	require.Len(t, dur.DataPoints, 1)
	require.EqualValues(t, 2, dur.DataPoints[0].Count)
}

// A row stuck publishing is as unpublished as a pending one: the oldest pending age, which
// KeiroOutboxOldestPendingHigh alerts on, counts it (a produce that cannot complete keeps its
// rows publishing under a live lease, with nothing pending behind them).
func TestOldestPendingAgeCountsRowsStuckPublishing(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := newKafka(t)
	st, err := outbox.NewStore(db.Schema, outbox.StoreOptions{})
	require.NoError(t, err)
	enqueue(t, db.Pool, st, keyedEvents("orders", 1, 2)...)
	_, err = db.Pool.Exec(context.Background(), `UPDATE `+db.Schema+`.keiro_outbox SET status = 'publishing',
	    claim_token = gen_random_uuid(), lease_until = now() + interval '1 hour', created_at = now() - interval '10 minutes'`)
	require.NoError(t, err)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	idle, err := outbox.NewRelay(db.Pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{Schema: db.Schema, MeterProvider: mp, Logger: testLogger(t)})
	require.NoError(t, err)
	res, err := idle.MaintenancePass(context.Background())
	require.NoError(t, err)
	require.True(t, res.Ran)
	require.GreaterOrEqual(t, res.OldestPendingAge, 10*time.Minute)
	age := gaugeByDestination(t, collectMetrics(t, reader), tracing.MetricOutboxOldestPending)["orders"]
	require.GreaterOrEqual(t, age, 600.0, "the rows stuck publishing count")
}

// gaugePoints counts the data points of the outbox-wide gauges in one collection.
func gaugePoints(t *testing.T, reader *sdkmetric.ManualReader) int {
	t.Helper()
	got := collectMetrics(t, reader)
	n := 0
	for _, name := range []string{tracing.MetricOutboxBacklog, tracing.MetricOutboxOldestPending, tracing.MetricOutboxDead} {
		switch g := got[name].(type) {
		case nil:
		case metricdata.Gauge[int64]:
			n += len(g.DataPoints)
		case metricdata.Gauge[float64]:
			n += len(g.DataPoints)
		default:
			t.Fatalf("%s is %T, not a gauge", name, got[name])
		}
	}
	return n
}

// Only the relay whose latest maintenance pass sampled the gauges exports them: a relay whose
// pass found the maintenance lock taken, whose pass failed, or that stopped exports no point of
// the outbox-wide gauges, so it cannot keep reporting an incident's backlog after the sampling
// relay saw it drain (an alert on its old sample would never resolve). When the sampling relay
// stops, the other's next pass takes the sampling over.
func TestOnlyTheSamplingRelayExportsTheGauges(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	ctx := context.Background()
	enqueue(t, db.Pool, st, keyedEvents("orders", 3, 1)...)
	newRelay := func() (*outbox.Relay, *sdkmetric.ManualReader) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		r, err := outbox.NewRelay(db.Pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{Schema: db.Schema,
			MeterProvider: mp, MaintenanceInterval: time.Hour, Logger: testLogger(t)})
		require.NoError(t, err)
		return r, reader
	}
	pass := func(r *outbox.Relay) bool {
		t.Helper()
		res, err := r.MaintenancePass(ctx)
		require.NoError(t, err)
		return res.Ran
	}
	a, readerA := newRelay()
	b, readerB := newRelay()
	require.Zero(t, gaugePoints(t, readerA), "no sample yet")

	// Both sample the backlog of the incident.
	require.True(t, pass(b))
	require.True(t, pass(a))
	require.Equal(t, map[string]float64{"orders": 3}, gaugeByDestination(t, collectMetrics(t, readerB), tracing.MetricOutboxBacklog))

	// The backlog drains; b's next pass finds the lock taken, a's samples the drained outbox.
	_, err := db.Pool.Exec(ctx, `DELETE FROM `+db.Schema+`.keiro_outbox`)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	var got bool
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, advisorylock.OutboxMaintenance(db.Schema)).Scan(&got))
	require.True(t, got)
	require.False(t, pass(b), "the maintenance lock is taken")
	require.NoError(t, tx.Commit(ctx))
	require.True(t, pass(a))

	require.Zero(t, gaugePoints(t, readerB), "b did not sample: it must not export its sample of the backlog")
	got2 := collectMetrics(t, readerA)
	require.Equal(t, map[string]float64{"orders": 0}, gaugeByDestination(t, got2, tracing.MetricOutboxBacklog))
	require.Equal(t, map[string]float64{"orders": 0}, gaugeByDestination(t, got2, tracing.MetricOutboxOldestPending))
	require.Equal(t, map[string]float64{"orders": 0}, gaugeByDestination(t, got2, tracing.MetricOutboxDead))

	// A pass that fails withdraws the sample too; the next that samples exports again.
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = a.MaintenancePass(canceled)
	require.Error(t, err)
	require.Zero(t, gaugePoints(t, readerA), "a failed pass sampled nothing")
	require.True(t, pass(a))
	require.Equal(t, 3, gaugePoints(t, readerA))

	// a runs and stops: a stopped relay exports no outbox-wide gauge, and b takes the sampling over.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	stop()
	require.NoError(t, <-done)
	require.Zero(t, gaugePoints(t, readerA), "a stopped")
	require.True(t, pass(b))
	require.Equal(t, map[string]float64{"orders": 0}, gaugeByDestination(t, collectMetrics(t, readerB), tracing.MetricOutboxBacklog))
}
