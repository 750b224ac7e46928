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
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{OnBatch: onSettled(p), MeterProvider: mp, MaxRecordBytes: 1024, Logger: testLogger(t)})
	p.Wait(t, 3, 30*time.Second, nil)

	require.Eventually(t, func() bool {
		res, err := idle.MaintenancePass(context.Background())
		require.NoError(t, err)
		return res.Ran
	}, 30*time.Second, time.Millisecond, "take the maintenance turn from the running relay")
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
