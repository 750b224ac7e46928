package tracing_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/tracing"
	"github.com/keiro-go/keiro/tracing/otelsetup"
)

// TestEndToEndTrace runs the whole path with in-memory telemetry: an HTTP request span whose
// handler enqueues in a transaction → the relay's send span → the consumer's process span →
// the handler's span, and checks they form one trace with the documented parent/link
// structure and attributes; then checks the counters and gauges after a scripted run with a
// rejected (too large) row, a poison message and a duplicate delivery.
func TestEndToEndTrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	const topic = "billing.orders.v1"
	kc.CreateTopic(t, topic, 2)
	kc.CreateTopic(t, topic+".dlq", 1)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Schema+`.orders_billed (message_id text PRIMARY KEY)`)
	require.NoError(t, err)

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(append([]sdkmetric.Option{sdkmetric.WithReader(reader)}, otelsetup.HistogramViews()...)...)
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })
	discard := slog.New(slog.DiscardHandler)

	// The service: POST /orders?id=…&size=… starts a server span and enqueues one event in a
	// transaction, as a business handler would.
	store, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracing.Tracer(tp).Start(r.Context(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		id := r.URL.Query().Get("id")
		span.SetAttributes(attribute.String("order.id", id))
		key := "customer-" + id
		payload := `{"order":"` + id + `"}`
		if r.URL.Query().Get("size") == "huge" {
			payload = `{"blob":"` + strings.Repeat("x", 4096) + `"}`
		}
		ev := envelope.Event{
			MessageID: "order-" + id, Source: "ordering", Destination: topic, Key: &key,
			EventType: "OrderPlaced", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
			Payload: []byte(payload), OccurredAt: time.Now().UTC(),
		}
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := store.EnqueueTx(ctx, tx, ev)
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	post := func(q url.Values) {
		resp, err := http.Post(srv.URL+"/orders?"+q.Encode(), "text/plain", nil)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusAccepted, resp.StatusCode, string(body))
	}
	post(url.Values{"id": {"1"}})
	post(url.Values{"id": {"2"}})
	post(url.Values{"id": {"poison"}})
	post(url.Values{"id": {"big"}, "size": {"huge"}}) // rejected by the relay: over MaxRecordBytes

	// The relay drains the four rows: three published, one rejected.
	batches := make(chan outbox.BatchResult, 16)
	client := kc.NewClient(t, outbox.ProducerOpts()...)
	relay, err := outbox.NewRelay(db.Pool, client, outbox.RelayConfig{
		Schema: db.Schema, MeterProvider: mp, TracerProvider: tp, Logger: discard,
		MaxRecordBytes: 2048, PollInterval: 20 * time.Millisecond, MaintenanceInterval: time.Hour,
		OnBatch: func(b outbox.BatchResult) { batches <- b },
	})
	require.NoError(t, err)
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	published, rejected := 0, 0
	deadline := time.After(30 * time.Second)
	for published < 3 || rejected < 1 {
		select {
		case b := <-batches:
			published += b.Published
			rejected += b.Rejected
		case <-deadline:
			t.Fatalf("relay: published %d, rejected %d; want 3 and 1", published, rejected)
		}
	}
	require.Equal(t, 3, published)
	require.Equal(t, 1, rejected)
	// Sample the outbox gauges after the drain, once the relay stopped: a stopped relay exports
	// no outbox gauge, and a pass of its own then has the maintenance lock to itself.
	stopRelay()
	require.NoError(t, <-relayDone)
	res, err := relay.MaintenancePass(ctx)
	require.NoError(t, err)
	require.True(t, res.Ran)

	// Replay order 1's record as Kafka would redeliver it: same bytes, same headers.
	var replay *kgo.Record
	for _, r := range kc.ConsumeRecords(t, 3, 30*time.Second, topic) {
		if headerValue(r, envelope.HeaderMessageID) == "order-1" {
			replay = &kgo.Record{Topic: topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers}
		}
	}
	require.NotNil(t, replay, "order-1 was published")
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, kc.NewClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner())).ProduceSync(pctx, replay).FirstErr())

	// The consumer: order 1 and 2 are processed, the poison message is dead-lettered, the
	// replay of order 1 is a duplicate.
	var handlerSpans sync.Map // message id → span context the handler saw
	handler := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		ctx, span := tracing.Tracer(tp).Start(ctx, "bill order")
		defer span.End()
		handlerSpans.Store(ev.MessageID, span.SpanContext())
		if ev.MessageID == "order-poison" {
			return inbox.Permanent(errors.New("unbillable order"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+db.Schema+`.orders_billed (message_id) VALUES ($1)`, ev.MessageID)
		return err
	}
	commits := make(chan inbox.Commit, 64)
	consumer, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
		KafkaOpts:     []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.HeartbeatInterval(100 * time.Millisecond)},
		Store:         inbox.StoreConfig{Schema: db.Schema},
		MeterProvider: mp, TracerProvider: tp, Logger: discard,
		// One record per transaction: the test counts handler runs and process spans, and a
		// group commit re-runs the mates before a failing record (their first run rolled back),
		// a number that depends on what the poll happened to buffer together.
		BatchSize:           1,
		Retry:               keiro.Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond},
		MaintenanceInterval: 50 * time.Millisecond,
		OnCommitted:         func(c inbox.Commit) { commits <- c },
	}, handler)
	require.NoError(t, err)
	consCtx, stopConsumer := context.WithCancel(ctx)
	consDone := make(chan error, 1)
	go func() { consDone <- consumer.Run(consCtx) }()
	committed := 0
	deadline = time.After(30 * time.Second)
	for committed < 4 {
		select {
		case c := <-commits:
			committed += c.Records
		case <-deadline:
			t.Fatalf("consumer committed %d records; want 4", committed)
		}
	}
	// The inbox backlog gauge is sampled by the consumer's maintenance ticker, which exposes no
	// signal: wait (bounded) until a sample sees the poisoned row.
	waitGauge(t, reader, tracing.MetricInboxBacklog, 1, 10*time.Second)
	stopConsumer()
	require.NoError(t, <-consDone)

	var billed []string
	rows, err := db.Pool.Query(ctx, `SELECT message_id FROM `+db.Schema+`.orders_billed ORDER BY 1`)
	require.NoError(t, err)
	billed, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"order-1", "order-2"}, billed, "effects ran once each; poison rolled back")

	t.Run("trace", func(t *testing.T) {
		spans := rec.Ended()
		for _, id := range []string{"1", "2", "poison"} {
			msgID := "order-" + id
			httpSpan := only(t, spans, func(s sdktrace.ReadOnlySpan) bool {
				return s.Name() == "POST /orders" && attrs(s)["order.id"] == id
			})
			send := only(t, spans, func(s sdktrace.ReadOnlySpan) bool {
				return s.Name() == "send "+topic && attrs(s)["messaging.message.id"] == msgID
			})
			process := all(spans, func(s sdktrace.ReadOnlySpan) bool {
				return s.Name() == "process "+topic && attrs(s)["messaging.message.id"] == msgID
			})
			traceID := httpSpan.SpanContext().TraceID()

			// send <topic>: child of the business span, Producer, semconv attributes.
			require.Equal(t, trace.SpanKindProducer, send.SpanKind())
			require.Equal(t, traceID, send.SpanContext().TraceID(), "%s: one trace", msgID)
			require.Equal(t, httpSpan.SpanContext().SpanID(), send.Parent().SpanID(), "%s: send's parent is the business span", msgID)
			sa := attrs(send)
			require.Equal(t, "kafka", sa["messaging.system"])
			require.Equal(t, "send", sa["messaging.operation.type"])
			require.Equal(t, "send", sa["messaging.operation.name"])
			require.Equal(t, topic, sa["messaging.destination.name"])
			require.Contains(t, []string{"0", "1"}, sa["messaging.destination.partition.id"])
			require.NotEmpty(t, sa["messaging.kafka.offset"])
			require.Equal(t, "customer-"+id, sa["messaging.kafka.message.key"])
			require.Equal(t, "1", sa["keiro.outbox.attempt"])
			require.Equal(t, attribute.STRING, attrType(send, "messaging.destination.partition.id"))
			require.Equal(t, attribute.INT64, attrType(send, "messaging.kafka.offset"))

			// process <topic>: parent and link = the send span (the record's traceparent).
			wantProcesses := 1
			if id == "1" {
				wantProcesses = 2 // the replayed duplicate
			}
			require.Len(t, process, wantProcesses, msgID)
			outcomes := map[string]int{}
			for _, p := range process {
				require.Equal(t, trace.SpanKindConsumer, p.SpanKind())
				require.Equal(t, traceID, p.SpanContext().TraceID(), "%s: one trace", msgID)
				require.Equal(t, send.SpanContext().SpanID(), p.Parent().SpanID(), "%s: process's parent is the send span", msgID)
				require.True(t, p.Parent().IsRemote())
				require.Len(t, p.Links(), 1)
				require.Equal(t, send.SpanContext().SpanID(), p.Links()[0].SpanContext.SpanID(), "%s: link to the creation context", msgID)
				pa := attrs(p)
				require.Equal(t, "kafka", pa["messaging.system"])
				require.Equal(t, "process", pa["messaging.operation.type"])
				require.Equal(t, "process", pa["messaging.operation.name"])
				require.Equal(t, topic, pa["messaging.destination.name"])
				require.Equal(t, sa["messaging.destination.partition.id"], pa["messaging.destination.partition.id"])
				require.NotEmpty(t, pa["messaging.kafka.offset"])
				require.Equal(t, "customer-"+id, pa["messaging.kafka.message.key"])
				require.Equal(t, "billing", pa["messaging.consumer.group.name"])
				outcomes[pa["keiro.inbox.outcome"]]++
			}
			switch id {
			case "1":
				require.Equal(t, map[string]int{"processed": 1, "duplicate": 1}, outcomes)
			case "2":
				require.Equal(t, map[string]int{"processed": 1}, outcomes)
			case "poison":
				require.Equal(t, map[string]int{"poisoned": 1}, outcomes)
			}

			// The handler's span hangs below the process span that ran it.
			sc, ok := handlerSpans.Load(msgID)
			require.True(t, ok, msgID)
			h := only(t, spans, func(s sdktrace.ReadOnlySpan) bool { return s.SpanContext().SpanID() == sc.(trace.SpanContext).SpanID() })
			require.Equal(t, traceID, h.SpanContext().TraceID())
			ran := false
			for _, p := range process {
				ran = ran || p.SpanContext().SpanID() == h.Parent().SpanID()
			}
			require.True(t, ran, "%s: the handler's ctx carries the process span", msgID)
		}

		// The rejected row has a send span (no ack, no partition) and no process span.
		big := only(t, spans, func(s sdktrace.ReadOnlySpan) bool {
			return s.Name() == "send "+topic && attrs(s)["messaging.message.id"] == "order-big"
		})
		require.Empty(t, attrs(big)["messaging.kafka.offset"])
		require.Empty(t, all(spans, func(s sdktrace.ReadOnlySpan) bool {
			return s.Name() == "process "+topic && attrs(s)["messaging.message.id"] == "order-big"
		}))
	})

	t.Run("metrics", func(t *testing.T) {
		m := collect(t, reader)
		dest := attribute.NewSet(tracing.DestinationKey.String(topic))
		cons := attribute.NewSet(tracing.ConsumerKey.String("billing"), tracing.DestinationKey.String(topic), tracing.GroupKey.String("billing"))

		require.EqualValues(t, 3, m.sum(t, tracing.MetricOutboxPublished, dest))
		require.EqualValues(t, 1, m.sum(t, tracing.MetricOutboxRejected, dest))
		require.EqualValues(t, 0, m.sumAll(tracing.MetricOutboxRetried))
		require.EqualValues(t, 0, m.sumAll(tracing.MetricOutboxDeadlettered))
		require.EqualValues(t, 0, m.sumAll(tracing.MetricOutboxReclaimed))
		count, sum := m.histogram(t, tracing.MetricOutboxBatchSize)
		require.GreaterOrEqual(t, count, uint64(1))
		require.EqualValues(t, 4, sum, "every row was claimed once")
		count, _ = m.histogram(t, tracing.MetricOutboxPublishLatency)
		require.EqualValues(t, 3, count, "one latency per acknowledged record")
		require.EqualValues(t, 0, m.gauge(t, tracing.MetricOutboxBacklog))
		require.EqualValues(t, 0, m.gauge(t, tracing.MetricOutboxOldestPending))
		require.EqualValues(t, 1, m.gauge(t, tracing.MetricOutboxDead), "the rejected row waits for an operator")

		require.EqualValues(t, 2, m.sum(t, tracing.MetricInboxProcessed, cons))
		require.EqualValues(t, 1, m.sum(t, tracing.MetricInboxDuplicates, cons))
		require.EqualValues(t, 1, m.sum(t, tracing.MetricInboxPoisoned, cons))
		require.EqualValues(t, 1, m.sum(t, tracing.MetricInboxDeadlettered, cons))
		require.EqualValues(t, 1, m.sum(t, tracing.MetricInboxFailed, cons), "the poisoning failure counts as a failure too")
		count, _ = m.histogram(t, tracing.MetricInboxHandlerDuration)
		require.EqualValues(t, 3, count, "the handler ran for order 1, order 2 and the poison message, not the duplicate")
		for _, p := range []string{"0", "1"} {
			lag, ok := m.gaugeAt(tracing.MetricConsumerLag, attribute.NewSet(tracing.GroupKey.String("billing"), tracing.DestinationKey.String(topic), tracing.PartitionKey.String(p)))
			if ok { // measured from Kafka for owned partitions: the stopped consumer reports none
				require.EqualValues(t, 0, lag, "partition %s fully consumed", p)
			}
		}
		require.EqualValues(t, 1, m.gauge(t, tracing.MetricInboxBacklog))

		// Metric attributes stay bounded: no message ids or keys.
		for _, sm := range m.rm.ScopeMetrics {
			for _, mt := range sm.Metrics {
				for _, set := range attributeSets(mt) {
					for _, kv := range set.ToSlice() {
						v := kv.Value.String()
						require.False(t, strings.HasPrefix(v, "order-") || strings.HasPrefix(v, "customer-"),
							"metric %s carries %s=%s", mt.Name, kv.Key, v)
					}
				}
			}
		}
	})
}

func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, a := range s.Attributes() {
		out[string(a.Key)] = a.Value.String()
	}
	return out
}

func attrType(s sdktrace.ReadOnlySpan, key string) attribute.Type {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.Type()
		}
	}
	return attribute.EMPTY
}

func all(spans []sdktrace.ReadOnlySpan, f func(sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if f(s) {
			out = append(out, s)
		}
	}
	return out
}

func only(t *testing.T, spans []sdktrace.ReadOnlySpan, f func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	t.Helper()
	got := all(spans, f)
	require.Len(t, got, 1)
	return got[0]
}

type collected struct{ rm metricdata.ResourceMetrics }

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var c collected
	require.NoError(t, r.Collect(context.Background(), &c.rm))
	return c
}

func (c collected) find(name string) (metricdata.Metrics, bool) {
	for _, sm := range c.rm.ScopeMetrics {
		if sm.Scope.Name != tracing.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// sum returns the value of counter name at the attribute set, failing if it was not recorded.
func (c collected) sum(t *testing.T, name string, set attribute.Set) int64 {
	t.Helper()
	m, ok := c.find(name)
	require.True(t, ok, "metric %s recorded", name)
	s, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is an int64 sum, not %T", name, m.Data)
	for _, dp := range s.DataPoints {
		if dp.Attributes.Equals(&set) {
			return dp.Value
		}
	}
	t.Fatalf("%s has no data point with %v", name, set.ToSlice())
	return 0
}

// sumAll returns the total of counter name over all attribute sets (0 if never recorded).
func (c collected) sumAll(name string) int64 {
	m, ok := c.find(name)
	if !ok {
		return 0
	}
	var n int64
	if s, ok := m.Data.(metricdata.Sum[int64]); ok {
		for _, dp := range s.DataPoints {
			n += dp.Value
		}
	}
	return n
}

func (c collected) histogram(t *testing.T, name string) (count uint64, sum float64) {
	t.Helper()
	m, ok := c.find(name)
	require.True(t, ok, "metric %s recorded", name)
	switch h := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range h.DataPoints {
			count += dp.Count
			sum += dp.Sum
		}
	case metricdata.Histogram[int64]:
		for _, dp := range h.DataPoints {
			count += dp.Count
			sum += float64(dp.Sum)
		}
	default:
		t.Fatalf("%s is not a histogram: %T", name, m.Data)
	}
	return count, sum
}

// gauge returns the single (or maximum) value of gauge name.
func (c collected) gauge(t *testing.T, name string) float64 {
	t.Helper()
	m, ok := c.find(name)
	require.True(t, ok, "metric %s recorded", name)
	vals := gaugeValues(m)
	require.NotEmpty(t, vals, "%s has data points", name)
	best := vals[0].v
	for _, v := range vals {
		best = max(best, v.v)
	}
	return best
}

func (c collected) gaugeAt(name string, set attribute.Set) (float64, bool) {
	m, ok := c.find(name)
	if !ok {
		return 0, false
	}
	for _, v := range gaugeValues(m) {
		if v.set.Equals(&set) {
			return v.v, true
		}
	}
	return 0, false
}

type gaugeValue struct {
	set attribute.Set
	v   float64
}

func gaugeValues(m metricdata.Metrics) []gaugeValue {
	var out []gaugeValue
	switch g := m.Data.(type) {
	case metricdata.Gauge[int64]:
		for _, dp := range g.DataPoints {
			out = append(out, gaugeValue{dp.Attributes, float64(dp.Value)})
		}
	case metricdata.Gauge[float64]:
		for _, dp := range g.DataPoints {
			out = append(out, gaugeValue{dp.Attributes, dp.Value})
		}
	}
	return out
}

func attributeSets(m metricdata.Metrics) []attribute.Set {
	var out []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Histogram[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	}
	return out
}

// waitGauge polls reader until gauge name reaches want or timeout passes. Only for gauges
// sampled on a component's own ticker, which exposes no signal to wait on.
func waitGauge(t *testing.T, reader *sdkmetric.ManualReader, name string, want float64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		c := collected{rm}
		if m, ok := c.find(name); ok {
			for _, v := range gaugeValues(m) {
				if v.v == want {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gauge %s did not reach %v within %s", name, want, timeout)
		}
		<-tick.C
	}
}
