package inbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/tracing"
)

// bigUndecodable is a record of about a megabyte without keiro headers: it fails decoding, and
// its dead-letter copy (the eight keiro-dlq-* headers more) is larger than the client's
// 1,000,012-byte batch limit.
func bigUndecodable(topic string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte("big-key"), Value: make([]byte, 999_900),
		Headers: []kgo.RecordHeader{{Key: "x-origin", Value: []byte("legacy-app")}}}
}

// TestDeadLetterTooLargeOmitsValue: a dead letter Kafka cannot take (its value alone fills the
// batch limit) is this record's failure, not an outage: the dead letter keeps the key, the
// original headers and every keiro-dlq-* header, its value is omitted (its size in
// keiro-dlq-value-omitted; the original stays at keiro-dlq-topic/partition/offset), and the
// partition moves on: the good record behind it is processed once. Before the fix the produce
// failed with MESSAGE_TOO_LARGE and was retried forever.
func TestDeadLetterTooLargeOmitsValue(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, testDeadLetterTooLargeOmitsValue)
}

func testDeadLetterTooLargeOmitsValue(t *testing.T, kc *testenv.Kafka) {
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	topic := kc.Topic("billing.huge.v1")
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	prod := kc.NewClient(t)
	good := newEvent("ordering", topic)
	produce(t, prod, bigUndecodable(topic))
	produceEvents(t, prod, good)

	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("billing"), Topics: []string{topic},
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}, fx.handler())
	p.waitCommitted(t, topic, 2, 60*time.Second)
	r.stop(t)

	require.Equal(t, 1, fx.count(t, good.MessageID), "the good record behind it ran once")
	st := r.c.Stats()
	require.EqualValues(t, 1, st.DeadLettered)
	require.EqualValues(t, 1, st.DeadLetterValueOmitted)
	dlq := kc.ConsumeRecords(t, 1, 30*time.Second, topic+".dlq")
	require.Len(t, dlq, 1)
	d := dlq[0]
	require.Empty(t, d.Value, "the value is omitted")
	require.Equal(t, "999900", header(d, inbox.HeaderDLQValueOmitted))
	require.Equal(t, "big-key", string(d.Key))
	require.Equal(t, "legacy-app", header(d, "x-origin"))
	require.Equal(t, inbox.ReasonDecode, header(d, inbox.HeaderDLQReason))
	require.NotEmpty(t, header(d, inbox.HeaderDLQError))
	require.Equal(t, topic, header(d, inbox.HeaderDLQTopic))
	require.Equal(t, "0", header(d, inbox.HeaderDLQPartition))
	require.Equal(t, "0", header(d, inbox.HeaderDLQOffset))
}

// TestDeadLetterRefusedByBrokerAsTooLarge: the broker (not the client's size check) refuses a
// dead letter with MESSAGE_TOO_LARGE (a topic whose max.message.bytes is below the client's
// limit): the consumer sends it again without its value at once, and the partition moves on.
func TestDeadLetterRefusedByBrokerAsTooLarge(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.broker-too-large.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	prod := kc.NewClient(t)
	good := newEvent("ordering", topic)
	produce(t, prod, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(strings.Repeat("x", 5000))})
	produceEvents(t, prod, good)
	refusal := kc.FailProduces(t, testenv.ProduceFailure{Topics: []string{topic + ".dlq"}, Err: kerr.MessageTooLarge, Requests: 1})

	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
		KafkaOpts: testenv.FastRetries(),
	}, fx.handler())
	p.waitCommitted(t, topic, 2, 30*time.Second)
	r.stop(t)

	require.Equal(t, 1, refusal.Refused())
	require.Equal(t, 1, fx.count(t, good.MessageID))
	require.EqualValues(t, 1, r.c.Stats().DeadLetterValueOmitted)
	dlq := kc.ConsumeRecords(t, 1, 30*time.Second, topic+".dlq")
	require.Len(t, dlq, 1)
	require.Empty(t, dlq[0].Value)
	require.Equal(t, "5000", header(dlq[0], inbox.HeaderDLQValueOmitted))
	require.Equal(t, "k", string(dlq[0].Key))
}

// TestDeadLetterSinkOutage: a dead-letter topic the consumer may not write, or that does not
// exist, is an outage of the dead-letter sink: the partition waits (nothing is lost, the good
// record behind is not run ahead of the bad one), the keiro.inbox.deadletter.blocked gauge
// shows the partition blocked and keiro.inbox.deadletter.failures counts the refusals by
// reason, an error line says what to do; once the topic is writable the record is
// dead-lettered once, with its value, and the partition moves on.
func TestDeadLetterSinkOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, code, advice string
	}{
		{"unauthorized", "topic_authorization_failed", "grant"},
		{"missing", "unknown_topic_or_partition", "create the topic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDB(t)
			fx := newEffects(t, db)
			kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{DisableAutoCreate: true})
			const topic = "billing.sink.v1"
			dlqTopic := topic + ".dlq"
			kc.CreateTopic(t, topic, 1)
			var fault *testenv.Outage
			if tc.name == "unauthorized" {
				fault = kc.FailProduces(t, testenv.ProduceFailure{Topics: []string{dlqTopic}, Err: kerr.TopicAuthorizationFailed})
			}
			prod := kc.NewClient(t)
			good := newEvent("ordering", topic)
			produce(t, prod, &kgo.Record{Topic: topic, Value: []byte("garbage, no headers")})
			produceEvents(t, prod, good)

			reader := sdkmetric.NewManualReader()
			var logs testenv.LogBuffer
			p := newProgress()
			r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
				Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
				Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
				MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
				Logger:        slog.New(slog.NewTextHandler(&logs, nil)),
				KafkaOpts:     append(testenv.FastRetries(), kgo.UnknownTopicRetries(1)),
			}, fx.handler())
			testenv.WaitFor(t, 30*time.Second, "the partition blocked on the dead-letter sink", func() bool {
				return r.c.Stats().DeadLetterBlocked == 1 && deadLetterFailures(t, reader)[tc.code] > 0
			})
			require.EqualValues(t, 1, gaugeValue(t, reader, tracing.MetricInboxDeadLetterBlocked))
			require.Zero(t, p.total(topic), "the partition waits")
			require.Zero(t, fx.count(t, good.MessageID), "nothing runs ahead of the bad record")
			require.Contains(t, logs.String(), tc.advice)
			pp := r.c.Progress()
			require.Len(t, pp, 1)
			require.False(t, pp[0].DeadLetterBlockedSince.IsZero(), "the partition's progress shows it waiting")
			require.NotEmpty(t, pp[0].DeadLetterError)

			if fault != nil {
				fault.End()
			} else {
				kc.CreateTopic(t, dlqTopic, 1)
			}
			p.waitCommitted(t, topic, 2, 30*time.Second)
			pp = r.c.Progress()
			require.Len(t, pp, 1)
			require.True(t, pp[0].DeadLetterBlockedSince.IsZero(), "no longer waiting")
			r.stop(t)

			require.Equal(t, 1, fx.count(t, good.MessageID))
			st := r.c.Stats()
			require.Zero(t, st.DeadLetterBlocked)
			require.EqualValues(t, 1, st.DeadLettered)
			require.Zero(t, st.DeadLetterValueOmitted)
			dlq := kc.ConsumeRecords(t, 1, 30*time.Second, dlqTopic)
			require.Len(t, dlq, 1)
			require.Equal(t, "garbage, no headers", string(dlq[0].Value))
			require.Empty(t, header(dlq[0], inbox.HeaderDLQValueOmitted))
		})
	}
}

// deadLetterFailures returns keiro.inbox.deadletter.failures by error.type.
func deadLetterFailures(t testing.TB, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	return counterBy(t, reader, tracing.MetricInboxDeadLetterFailures, tracing.ErrorTypeKey)
}

// counterBy returns the counter's points summed by the values of keys, joined with spaces
// ("billing orders.v1 0" for a group, a topic and a partition).
func counterBy(t testing.TB, reader *sdkmetric.ManualReader, name string, keys ...attribute.Key) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	eachMetric(t, reader, name, func(data metricdata.Aggregation) {
		for _, p := range data.(metricdata.Sum[int64]).DataPoints {
			var b strings.Builder
			for i, k := range keys {
				if i > 0 {
					b.WriteByte(' ')
				}
				v, _ := p.Attributes.Value(k)
				b.WriteString(v.AsString())
			}
			out[b.String()] += p.Value
		}
	})
	return out
}

// gaugeValue returns the sum of the gauge's points.
func gaugeValue(t testing.TB, reader *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var n int64
	eachMetric(t, reader, name, func(data metricdata.Aggregation) {
		for _, p := range data.(metricdata.Gauge[int64]).DataPoints {
			n += p.Value
		}
	})
	return n
}

func eachMetric(t testing.TB, reader *sdkmetric.ManualReader, name string, f func(metricdata.Aggregation)) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				f(m.Data)
			}
		}
	}
}

// TestDeadLetterRefusedByRealBrokerAsTooLarge: on Apache Kafka, a dead-letter topic whose
// max.message.bytes is below the dead letter (and below the client's batch limit, so the
// client sends it) refuses it with MESSAGE_TOO_LARGE: the consumer sends it again without its
// value at once, and the partition moves on.
func TestDeadLetterRefusedByRealBrokerAsTooLarge(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewRealKafka(t)
	topic := kc.Topic("billing.small-dlq.v1")
	kc.CreateTopic(t, topic, 1)
	maxBytes := "20000"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := kadm.NewClient(kc.Client).CreateTopic(ctx, 1, -1, map[string]*string{"max.message.bytes": &maxBytes}, topic+".dlq")
	require.NoError(t, err)
	require.NoError(t, res.Err)
	prod := kc.NewClient(t)
	good := newEvent("ordering", topic)
	produce(t, prod, &kgo.Record{Topic: topic, Key: []byte("k"), Value: incompressible(50_000)})
	produceEvents(t, prod, good)

	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("billing"), Topics: []string{topic},
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}, fx.handler())
	p.waitCommitted(t, topic, 2, 60*time.Second)
	r.stop(t)

	require.Equal(t, 1, fx.count(t, good.MessageID))
	require.EqualValues(t, 1, r.c.Stats().DeadLetterValueOmitted)
	dlq := kc.ConsumeRecords(t, 1, 30*time.Second, topic+".dlq")
	require.Len(t, dlq, 1)
	require.Empty(t, dlq[0].Value)
	require.Equal(t, "50000", header(dlq[0], inbox.HeaderDLQValueOmitted))
	require.Equal(t, "k", string(dlq[0].Key))
}

// incompressible returns n bytes of random hex text (a compressed batch is as large as it).
func incompressible(n int) []byte {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return []byte(hex.EncodeToString(b))
}
