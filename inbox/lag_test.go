package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/tracing"
)

// lagPoints returns keiro.consumer.lag's data points as attribute set → value.
func lagPoints(t *testing.T, reader *sdkmetric.ManualReader) map[attribute.Distinct]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[attribute.Distinct]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != tracing.MetricConsumerLag {
				continue
			}
			for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				out[dp.Attributes.Equivalent()] = dp.Value
			}
		}
	}
	return out
}

// The lag is measured from Kafka (end offset minus the group's committed offset), so a
// partition whose handler is stuck shows its whole backlog — a lag sampled at commit time
// would show nothing, as nothing commits. Once the consumer stops, its partitions are no
// longer reported.
func TestConsumerLagMeasuredFromKafka(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	const topic = "billing.lag.v1"
	kc.CreateTopic(t, topic, 1)
	produceEvents(t, kc.NewClient(t), keyedEvents("ordering", topic, 5, 1)...)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	release := make(chan struct{})
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
		Store:               inbox.StoreConfig{Schema: db.Schema},
		MeterProvider:       mp,
		MaintenanceInterval: 20 * time.Millisecond,
		OnCommitted:         p.onCommitted,
	}, func(ctx context.Context, _ pgx.Tx, _ envelope.Event) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})

	want := attribute.NewSet(tracing.GroupKey.String("billing"), tracing.DestinationKey.String(topic), tracing.PartitionKey.String("0"))
	waitLag := func(v int64) {
		t.Helper()
		require.Eventually(t, func() bool {
			got, ok := lagPoints(t, reader)[want.Equivalent()]
			return ok && got == v
		}, 30*time.Second, 10*time.Millisecond, "lag %d for %v", v, want.ToSlice())
	}
	waitLag(5)

	close(release)
	p.waitCommitted(t, topic, 5, 30*time.Second)
	waitLag(0)

	r.stop(t)
	require.Empty(t, lagPoints(t, reader), "a stopped consumer owns no partition")
}

// GroupLag names a group Kafka does not know with ErrGroupUnknown, and reports a known
// group's lag per partition.
func TestGroupLag(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.grouplag.v1"
	kc.CreateTopic(t, topic, 2)
	cl := kc.NewClient(t)
	ctx := context.Background()
	_, err := inbox.GroupLag(ctx, cl, "nobody")
	require.ErrorIs(t, err, inbox.ErrGroupUnknown)

	evs := keyedEvents("ordering", topic, 6, 2)
	produceEvents(t, cl, evs...)
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}, fx.handler())
	p.waitCommitted(t, topic, 6, 30*time.Second)
	lag, err := inbox.GroupLag(ctx, cl, "billing")
	require.NoError(t, err)
	require.Zero(t, lag.Lag.Total())
	require.Len(t, lag.Lag[topic], 2)
	r.stop(t)

	produceEvents(t, cl, keyedEvents("ordering", topic, 4, 2)...)
	lag, err = inbox.GroupLag(ctx, cl, "billing")
	require.NoError(t, err)
	require.EqualValues(t, 4, lag.Lag.Total())
}
