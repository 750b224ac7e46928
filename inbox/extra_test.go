package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/tracing"
)

func TestProcessBatchWithBatchHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db)
	var ds []inbox.Delivery
	for range 6 {
		ds = append(ds, inbox.Delivery{Event: newEvent("ordering", "t")})
	}
	poison := ds[3].Event.MessageID
	var calls []int
	bh := func(ctx context.Context, tx pgx.Tx, evs []envelope.Event) error {
		calls = append(calls, len(evs))
		for _, ev := range evs {
			if err := fx.handler()(ctx, tx, ev); err != nil {
				return err
			}
			if ev.MessageID == poison {
				return inbox.Permanent(errors.New("poison"))
			}
		}
		return nil
	}
	// Two already processed: only the other four reach the batch handler.
	_, err := s.ProcessBatch(ctx, db.Pool, ds[:2], fx.handler())
	require.NoError(t, err)
	res, err := s.ProcessBatchWith(ctx, db.Pool, ds, bh)
	require.NoError(t, err)
	// One batch call; event by event up to the failing one (2, then 3); the events before it
	// in a new batch (2); the failing one alone (3); the rest in a batch (4, 5).
	require.Equal(t, []int{4, 1, 1, 1, 1, 2}, calls)
	want := []inbox.Outcome{inbox.Duplicate, inbox.Duplicate, inbox.Processed, inbox.Poisoned, inbox.Processed, inbox.Processed}
	for i, r := range res {
		require.Equal(t, want[i], r.Outcome, "item %d", i)
	}
	for i, d := range ds {
		n := 1
		if i == 3 {
			n = 0
		}
		require.Equal(t, n, fx.count(t, d.Event.MessageID))
	}
	// Without failures, one call for the whole batch.
	calls = nil
	var more []inbox.Delivery
	for range 5 {
		more = append(more, inbox.Delivery{Event: newEvent("ordering", "t")})
	}
	res, err = s.ProcessBatchWith(ctx, db.Pool, more, bh)
	require.NoError(t, err)
	require.Equal(t, []int{5}, calls)
	for _, r := range res {
		require.Equal(t, inbox.Processed, r.Outcome)
	}
}

func TestStoreMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(ctx) }()
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.MeterProvider = mp; c.MaxAttempts = 2 })
	ev := newEvent("ordering", "billing.orders.v1")
	d := inbox.Delivery{Event: ev, Kafka: &inbox.KafkaRef{Topic: "billing.orders.v1"}}
	for range 2 {
		_, err := s.Process(ctx, db.Pool, d, fx.handler())
		require.NoError(t, err)
	}
	bad := inbox.Delivery{Event: newEvent("ordering", "billing.orders.v1"), Kafka: d.Kafka}
	for range 2 {
		_, err := s.Process(ctx, db.Pool, bad, func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("no") })
		require.NoError(t, err)
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	sums := map[string]int64{}
	var sawHistogram bool
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, "keiro", sm.Scope.Name)
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					c, ok := p.Attributes.Value("keiro.consumer.name")
					tp, _ := p.Attributes.Value("messaging.destination.name")
					if m.Name == "messaging.client.consumed.messages" {
						require.False(t, ok, "the semantic conventions' metric carries no keiro attribute")
						c = attribute.StringValue("billing")
					}
					require.Equal(t, "billing", c.AsString())
					require.Equal(t, "billing.orders.v1", tp.AsString())
					sums[m.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name == "keiro.inbox.handler.duration" {
					sawHistogram = data.DataPoints[0].Count == 3
				}
			}
		}
	}
	require.Equal(t, map[string]int64{
		"keiro.inbox.processed": 1, "keiro.inbox.duplicates": 1,
		"keiro.inbox.failed": 2, "keiro.inbox.poisoned": 1,
		"messaging.client.consumed.messages": 4,
	}, sums)
	require.True(t, sawHistogram, "three handler runs recorded")
}

// signalHandler is a slog.Handler that reports messages containing a substring.
type signalHandler struct {
	substr string
	hits   chan string
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.substr) {
		select {
		case h.hits <- r.Message:
		default:
		}
	}
	return nil
}
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *signalHandler) WithGroup(string) slog.Handler      { return h }

// A dead-letter produce that fails (the topic does not exist yet) is retried, never dropped,
// and the offset is not committed until it succeeds.
func TestConsumerRetriesFailingDeadLetterProduce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.dlqfail.v1"
	kc.CreateTopic(t, topic, 1)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 3, 1)
	produceEvents(t, prod, evs...)

	sig := &signalHandler{substr: "dead-letter produce failed", hits: make(chan string, 1)}
	p := newProgress()
	var dead atomic.Int64
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, DeadLetterTopic: "late-dlq",
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
		Logger:         slog.New(sig),
		OnDeadLettered: func(*kgo.Record, string) { dead.Add(1) },
	}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if ev.MessageID == evs[1].MessageID {
			return inbox.Permanent(errors.New("reject"))
		}
		return fx.handler()(ctx, tx, ev)
	})
	select {
	case <-sig.hits:
	case <-time.After(30 * time.Second):
		t.Fatal("no failed dead-letter produce was reported")
	}
	require.LessOrEqual(t, p.total(topic), int64(1), "nothing past the poisoned record is committed")
	require.EqualValues(t, 0, dead.Load())
	kc.CreateTopic(t, "late-dlq", 1)
	p.waitCommitted(t, topic, 3, 60*time.Second)
	r.stop(t)
	require.EqualValues(t, 1, dead.Load())
	recs := kc.ConsumeRecords(t, 1, 10*time.Second, "late-dlq")
	require.Len(t, recs, 1)
	require.Equal(t, evs[1].Payload, recs[0].Value)
	require.Equal(t, 1, fx.count(t, evs[2].MessageID))
}

func TestConsumerSchemaDecoder(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.schema.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 4, 1)
	evs[2].Payload = []byte("not avro")
	produceEvents(t, prod, evs...)

	var mu sync.Mutex
	registryDown := 2 // the registry fails twice before answering
	dec := func(_ context.Context, ev *envelope.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if registryDown > 0 {
			registryDown--
			return errors.New("schema registry unreachable")
		}
		if string(ev.Payload) == "not avro" {
			return inbox.Permanent(errors.New("payload is not Confluent-framed"))
		}
		ev.Payload = []byte(`{"decoded":` + string(ev.Payload) + `}`)
		return nil
	}
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted, SchemaDecoder: dec,
	}, fx.handler())
	p.waitCommitted(t, topic, 4, 30*time.Second)
	r.stop(t)
	require.EqualValues(t, 3, r.c.Stats().Processed)
	require.EqualValues(t, 1, r.c.Stats().DeadLettered)
	var payload string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT payload FROM `+fx.table+` WHERE message_id = $1`, evs[0].MessageID).Scan(&payload))
	require.Equal(t, `{"decoded":{"i":0}}`, payload)
	dlq := kc.ConsumeRecords(t, 1, 10*time.Second, topic+".dlq")
	require.Len(t, dlq, 1)
	require.Equal(t, inbox.ReasonSchema, header(dlq[0], inbox.HeaderDLQReason))
	require.Equal(t, []byte("not avro"), dlq[0].Value, "the original bytes, not the decoded ones")
}

// A tiny buffer forces the partition to pause and resume over and over; nothing stalls or is
// lost, and per-key order holds.
func TestConsumerBackPressure(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.pressure.v1"
	kc.CreateTopic(t, topic, 2)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 200, 5)
	produceEvents(t, prod, evs...)
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
		MaxBufferedRecords: 4, CommitEvery: 3, MaxConcurrentPartitions: 1,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}, fx.handler())
	p.waitCommitted(t, topic, 200, 60*time.Second)
	r.stop(t)
	requireOncePerMessageInKeyOrder(t, fx, evs)
}

// A backlog spread evenly over the partitions is fetched once: a full buffer holds up the
// next poll instead of pausing its partition, which would make the client drop, and fetch
// again, what it already held for it. A partition is paused only when another one has run dry
// (at the start, before its first fetch, and at the end; mid-run when a worker is starved).
// The test watches the consumer's back-pressure events: every pause must find another
// partition's buffer empty, and the poll loop must have held up its poll for a full buffer.
// Pausing as soon as a buffer filled pauses while the other partition has records (and never
// holds), and fails both.
func TestConsumerUniformBacklogIsFetchedOnce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.backlog.v1"
	kc.CreateTopic(t, topic, 2)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 4000, 16)
	produceEvents(t, prod, evs...)
	var (
		mu         sync.Mutex
		holds      int
		pauses     int
		violations []string
	)
	p := newProgress()
	r := startConsumerWith(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
		MaxBufferedRecords: 100, BatchSize: 20,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
		KafkaOpts: []kgo.Opt{kgo.FetchMaxPartitionBytes(16 << 10)},
	}, fx.handler(), func(c *inbox.Consumer) {
		inbox.SetPressureHook(c, func(ev inbox.PressureEvent) {
			switch ev.Kind {
			case "hold":
				mu.Lock()
				holds++
				mu.Unlock()
			case "pause":
				// Called from the poll loop before its next poll: a buffer it found empty
				// cannot have been refilled meanwhile.
				self := fmt.Sprintf("%s/%d", ev.Topic, ev.Partition)
				buffered := inbox.Buffered(c)
				dry := false
				for tp, n := range buffered {
					if tp != self && n == 0 {
						dry = true
					}
				}
				mu.Lock()
				pauses++
				if !dry {
					violations = append(violations, fmt.Sprintf("%s paused while every other partition had records: %v", self, buffered))
				}
				mu.Unlock()
			}
		})
	})
	p.waitCommitted(t, topic, int64(len(evs)), 60*time.Second)
	r.stop(t)
	requireOncePerMessageInKeyOrder(t, fx, evs)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d holds, %d pauses", holds, pauses)
	require.Empty(t, violations, "a full buffer alone must hold up the poll, not pause its partition")
	require.Positive(t, holds, "the poll loop held up a poll for a full buffer")
	require.EqualValues(t, pauses, r.c.Stats().FetchPauses, "every pause counted in Stats.FetchPauses")
}

// A partition whose buffer is full because its handler is slow does not hold up the others:
// once another partition needs a poll, the full one is paused instead.
func TestConsumerFullPartitionDoesNotHoldUpOthers(t *testing.T) {
	t.Parallel()
	t.Run("records", func(t *testing.T) {
		t.Parallel()
		testFullPartition(t, func(c *inbox.ConsumerConfig) { c.MaxBufferedRecords = 10 }, nil)
	})
	// Large records fill the buffer by bytes long before its record bound.
	t.Run("bytes", func(t *testing.T) {
		t.Parallel()
		testFullPartition(t, func(c *inbox.ConsumerConfig) { c.MaxBufferedBytes = 40 << 10 },
			[]byte(`{"blob":"`+strings.Repeat("x", 4<<10)+`"}`))
	})
}

func testFullPartition(t *testing.T, bound func(*inbox.ConsumerConfig), payload []byte) {
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const slow, fast = "billing.slow.v1", "billing.fast.v1"
	kc.CreateTopic(t, slow, 1)
	kc.CreateTopic(t, fast, 1)
	prod := kc.NewClient(t)
	backlog := keyedEvents("ordering", slow, 300, 4)
	if payload != nil {
		for i := range backlog {
			backlog[i].Payload = payload
		}
	}
	produceEvents(t, prod, backlog...)
	release := make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if ev.Destination == slow {
			select {
			case <-release:
			case <-time.After(20 * time.Millisecond):
			}
		}
		return fx.handler()(ctx, tx, ev)
	}
	p := newProgress()
	reader := sdkmetric.NewManualReader()
	cfg := inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{slow, fast},
		BatchSize: 1, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}
	bound(&cfg)
	r := startConsumer(t, db.Pool, cfg, h)
	p.waitCommitted(t, slow, 1, 30*time.Second)
	flowing := keyedEvents("ordering", fast, 30, 3)
	for i := range flowing {
		k := "fast-" + *flowing[i].Key // keys of their own: order is per partition
		flowing[i].Key = &k
	}
	produceEvents(t, prod, flowing...)
	p.waitCommitted(t, fast, int64(len(flowing)), 30*time.Second)
	require.Less(t, p.total(slow), int64(len(backlog)), "the slow partition is still working off its backlog")
	require.Positive(t, r.c.Stats().FetchPauses, "the full partition was paused for the other's poll")
	// keiro.consumer.fetch.pauses names the partition (the partition may still be paused
	// meanwhile: the count lies between the stats read before and after the collection).
	before := r.c.Stats().FetchPauses
	paused := counterBy(t, reader, tracing.MetricConsumerFetchPauses, tracing.GroupKey, tracing.DestinationKey, tracing.PartitionKey)
	after := r.c.Stats().FetchPauses
	require.GreaterOrEqual(t, paused["billing "+slow+" 0"], before, "pauses counted for the slow partition: %v", paused)
	require.LessOrEqual(t, paused["billing "+slow+" 0"], after, "pauses counted for the slow partition: %v", paused)
	require.Len(t, paused, 1, "only the slow partition is ever full")
	close(release)
	p.waitCommitted(t, slow, int64(len(backlog)), 60*time.Second)
	r.stop(t)
	requireOncePerMessageInKeyOrder(t, fx, append(backlog, flowing...))
}

// traceLog records, per message, the trace ids of the contexts lines were logged with.
type traceLog struct {
	mu  sync.Mutex
	ids map[string][]string
}

func (l *traceLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *traceLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *traceLog) WithGroup(string) slog.Handler            { return l }
func (l *traceLog) Handle(ctx context.Context, r slog.Record) error {
	id := ""
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		id = sc.TraceID().String()
	}
	l.mu.Lock()
	l.ids[r.Message] = append(l.ids[r.Message], id)
	l.mu.Unlock()
	return nil
}

func (l *traceLog) traceIDs(msg string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ids[msg]...)
}

// Lines the runner logs about one record (its retries, its dead letter) carry the trace id of
// the record's trace context, so that a log search by trace finds them next to the spans.
func TestConsumerRecordLogLinesCarryTheRecordsTrace(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.traced.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 2, 1)
	produceEvents(t, prod, evs...)
	var failed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		switch {
		case ev.MessageID == evs[0].MessageID && failed.CompareAndSwap(false, true):
			return errors.New("downstream not ready")
		case ev.MessageID == evs[1].MessageID:
			return inbox.Permanent(errors.New("malformed"))
		}
		return fx.handler()(ctx, tx, ev)
	}
	logs := &traceLog{ids: map[string][]string{}}
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: 1,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted, Logger: slog.New(logs),
		Retry: keiro.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
	}, h)
	p.waitCommitted(t, topic, 2, 30*time.Second)
	r.stop(t)
	want := strings.Split(evs[0].TraceContext.Traceparent, "-")[1]
	require.Equal(t, []string{want}, logs.traceIDs("handler failed; retrying"))
	require.Equal(t, []string{want}, logs.traceIDs("record dead-lettered"))
}

// The consumer's maintenance deletes completed rows past the retention and samples the
// backlog gauge.
func TestConsumerMaintenance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	s := newStore(t, db)
	var ds []inbox.Delivery
	for range 3 {
		ds = append(ds, inbox.Delivery{Event: newEvent("ordering", "t")})
	}
	_, err := s.ProcessBatch(ctx, db.Pool, ds[:2], fx.handler())
	require.NoError(t, err)
	_, err = s.Process(ctx, db.Pool, ds[2], func(context.Context, pgx.Tx, envelope.Event) error { return errors.New("x") })
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE `+db.Schema+`.keiro_inbox SET completed_at = now() - interval '2 hours', failed_at = now() - interval '2 hours'`)
	require.NoError(t, err)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(ctx) }()
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "maint", 1)
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{"maint"},
		Store:     inbox.StoreConfig{Schema: db.Schema},
		Retention: time.Hour, MaintenanceInterval: 10 * time.Millisecond, MeterProvider: mp,
	}, fx.handler())
	require.Eventually(t, func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_inbox`).Scan(&n)
		return n == 1
	}, 30*time.Second, 10*time.Millisecond, "old completed rows deleted, the failed one kept")
	r.stop(t)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	var backlog int64 = -1
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "keiro.inbox.backlog" {
				backlog = g.DataPoints[0].Value
			}
		}
	}
	require.EqualValues(t, 1, backlog)
}

// A partition retrying a failing handler gives up its concurrency slot while it backs off, so
// other partitions keep flowing even with MaxConcurrentPartitions = 1.
func TestConsumerRetryingPartitionDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const blocked, free = "billing.blocked.v1", "billing.free.v1"
	kc.CreateTopic(t, blocked, 1)
	kc.CreateTopic(t, free, 1)
	prod := kc.NewClient(t)
	stuck := keyedEvents("ordering", blocked, 1, 1)
	flowing := keyedEvents("ordering", free, 20, 2)
	produceEvents(t, prod, stuck...)

	fixed := make(chan struct{})
	retrying := make(chan struct{})
	var failures atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if ev.MessageID == stuck[0].MessageID {
			select {
			case <-fixed:
			default:
				if failures.Add(1) == 3 {
					close(retrying)
				}
				return errors.New("downstream not ready")
			}
		}
		return fx.handler()(ctx, tx, ev)
	}
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{blocked, free}, MaxConcurrentPartitions: 1,
		Store: inbox.StoreConfig{Schema: db.Schema, MaxAttempts: 1_000_000}, OnCommitted: p.onCommitted,
		Retry: keiro.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
	}, h)
	<-retrying
	produceEvents(t, prod, flowing...) // only after the blocked partition is stuck retrying
	p.waitCommitted(t, free, 20, 30*time.Second)
	require.EqualValues(t, 0, p.total(blocked))
	close(fixed)
	p.waitCommitted(t, blocked, 1, 30*time.Second)
	r.stop(t)
	require.Equal(t, 1, fx.count(t, stuck[0].MessageID))
}

// In batch mode a transient failure in the middle of a batch is retried in place before the
// records after it: the effects of one key keep their order.
func TestConsumerBatchPathKeepsKeyOrderUnderFailures(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.batchorder.v1"
	kc.CreateTopic(t, topic, 1)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 25, 1)
	produceEvents(t, prod, evs...)
	var failures atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if ev.MessageID == evs[4].MessageID && failures.Add(1) <= 2 {
			return errors.New("transient")
		}
		return fx.handler()(ctx, tx, ev)
	}
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: 10,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}, h)
	p.waitCommitted(t, topic, 25, 30*time.Second)
	r.stop(t)
	require.EqualValues(t, 3, failures.Load())
	requireOncePerMessageInKeyOrder(t, fx, evs)
}

// TestConsumerDefaultsKeepKeyOrderUnderFailures: with the default configuration (group
// commit) and a backlog, handler failures of every kind in the middle of batches (transient
// errors, contention, a panic, a poison message) keep every key's effects in order and once;
// only the poison message is missing and dead-lettered. Run with a Handler and a BatchHandler.
func TestConsumerDefaultsKeepKeyOrderUnderFailures(t *testing.T) {
	t.Parallel()
	for _, batchHandler := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch-handler=%v", batchHandler), func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDB(t)
			fx := newEffects(t, db)
			kc := testenv.NewKafka(t)
			const topic = "billing.default-order.v1"
			kc.CreateTopic(t, topic, 3)
			kc.CreateTopic(t, topic+".dlq", 1)
			evs := keyedEvents("ordering", topic, 600, 12)
			produceEvents(t, kc.NewClient(t), evs...) // a backlog: batches form at once
			poison := evs[333].MessageID
			var mu sync.Mutex
			calls := map[string]int{}
			h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
				mu.Lock()
				calls[ev.MessageID]++
				n := calls[ev.MessageID]
				mu.Unlock()
				switch ev.MessageID {
				case evs[17].MessageID, evs[250].MessageID, evs[598].MessageID:
					if n <= 2 {
						return errors.New("transient")
					}
				case evs[101].MessageID, evs[402].MessageID:
					if n <= 3 {
						return raise(ctx, tx, "40P01")
					}
				case evs[499].MessageID:
					if n == 1 {
						panic("boom")
					}
				case poison:
					return errors.New("poison")
				}
				return fx.handler()(ctx, tx, ev)
			}
			cfg := inbox.ConsumerConfig{
				Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
				Store: inbox.StoreConfig{Schema: db.Schema, MaxAttempts: 3},
			}
			var handler inbox.Handler = h
			if batchHandler {
				cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, evs []envelope.Event) error {
					for _, ev := range evs {
						if err := h(ctx, tx, ev); err != nil {
							return err
						}
					}
					return nil
				}
				handler = nil
			}
			p := newProgress()
			cfg.OnCommitted = p.onCommitted
			r := startConsumer(t, db.Pool, cfg, handler)
			p.waitCommitted(t, topic, 600, 60*time.Second)
			r.stop(t)

			var good []envelope.Event
			for _, ev := range evs {
				if ev.MessageID != poison {
					good = append(good, ev)
				}
			}
			requireOncePerMessageInKeyOrder(t, fx, good)
			st := r.c.Stats()
			require.EqualValues(t, 1, st.DeadLettered)
			require.EqualValues(t, 599, st.Processed)
			require.EqualValues(t, 600, st.Committed)
			dlq := dlqRecords(t, kc, topic+".dlq", 1)
			require.Equal(t, "3", header(dlq[poison], inbox.HeaderDLQAttempts))
		})
	}
}
