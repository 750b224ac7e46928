package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// toKgo converts an envelope record for producing.
func toKgo(r envelope.Record) *kgo.Record {
	hs := make([]kgo.RecordHeader, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: hs}
}

func produce(t testing.TB, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
}

func produceEvents(t testing.TB, cl *kgo.Client, evs ...envelope.Event) {
	t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i := range evs {
		recs[i] = toKgo(evs[i].Record(envelope.EncodeOptions{}))
	}
	produce(t, cl, recs...)
}

// progress follows a consumer's commits so tests wait on signals, not sleeps: per topic, the
// committed offsets summed over its partitions (each starts at 0, so the sum is the number of
// records consumed), as a testenv.Progress.
type progress struct {
	mu        sync.Mutex
	committed map[string]map[int32]int64
	topics    map[string]*testenv.Progress
}

func newProgress() *progress {
	return &progress{committed: map[string]map[int32]int64{}, topics: map[string]*testenv.Progress{}}
}

// of returns topic's count.
func (p *progress) of(topic string) *testenv.Progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.topics[topic] == nil {
		p.topics[topic] = new(testenv.Progress)
	}
	return p.topics[topic]
}

func (p *progress) onCommitted(c inbox.Commit) {
	p.mu.Lock()
	if p.committed[c.Topic] == nil {
		p.committed[c.Topic] = map[int32]int64{}
	}
	if c.Offset > p.committed[c.Topic][c.Partition] {
		p.committed[c.Topic][c.Partition] = c.Offset
	}
	var n int64
	for _, o := range p.committed[c.Topic] {
		n += o
	}
	p.mu.Unlock()
	p.of(c.Topic).Set(n)
}

// total returns the number of records of topic committed.
func (p *progress) total(topic string) int64 { return p.of(topic).Value() }

// waitCommitted waits until n records of topic are committed.
func (p *progress) waitCommitted(t testing.TB, topic string, n int64, timeout time.Duration) {
	t.Helper()
	p.of(topic).Wait(t, n, timeout, nil)
}

type running struct {
	c      *inbox.Consumer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (r *running) stop(t testing.TB) {
	t.Helper()
	r.once.Do(func() { r.stopOnce(t) })
}

func (r *running) stopOnce(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		buf := make([]byte, 1<<20)
		t.Logf("%s", buf[:runtime.Stack(buf, true)])
		t.Fatal("consumer did not stop")
	}
}

func startConsumer(t testing.TB, pool *pgxpool.Pool, cfg inbox.ConsumerConfig, h inbox.Handler) *running {
	t.Helper()
	return startConsumerWith(t, pool, cfg, h)
}

// startConsumerWith is startConsumer with each of mod applied to the consumer before it runs.
func startConsumerWith(t testing.TB, pool *pgxpool.Pool, cfg inbox.ConsumerConfig, h inbox.Handler, mod ...func(*inbox.Consumer)) *running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.KafkaOpts = append([]kgo.Opt{kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, cfg.KafkaOpts...)
	if cfg.Retry.Initial == 0 {
		cfg.Retry = keiro.Backoff{Initial: time.Millisecond, Max: 20 * time.Millisecond}
	}
	c, err := inbox.NewConsumer(pool, cfg, h)
	require.NoError(t, err)
	for _, m := range mod {
		m(c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// keyedEvents returns n events over keys k0..k(keys-1), in order.
func keyedEvents(source, topic string, n, keys int) []envelope.Event {
	evs := make([]envelope.Event, n)
	for i := range evs {
		evs[i] = newEvent(source, topic)
		k := fmt.Sprintf("key-%d", i%keys)
		evs[i].Key = &k
		evs[i].Payload = []byte(fmt.Sprintf(`{"i":%d}`, i))
	}
	return evs
}

// requireOncePerMessageInKeyOrder checks every event has exactly one effect and that the
// effects of each key ran in the order the events were produced.
func requireOncePerMessageInKeyOrder(t testing.TB, fx *effects, evs []envelope.Event) {
	t.Helper()
	rows, err := fx.db.Pool.Query(context.Background(), `SELECT message_id, msg_key FROM `+fx.table+` ORDER BY seq`)
	require.NoError(t, err)
	type eff struct{ id, key string }
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (eff, error) {
		var e eff
		var k *string
		err := r.Scan(&e.id, &k)
		if k != nil {
			e.key = *k
		}
		return e, err
	})
	require.NoError(t, err)
	count := map[string]int{}
	perKey := map[string][]string{}
	for _, e := range got {
		count[e.id]++
		perKey[e.key] = append(perKey[e.key], e.id)
	}
	want := map[string][]string{}
	for _, ev := range evs {
		require.Equal(t, 1, count[ev.MessageID], "effects of %s", ev.MessageID)
		want[*ev.Key] = append(want[*ev.Key], ev.MessageID)
	}
	require.Len(t, got, len(evs))
	for k, ids := range want {
		require.Equal(t, ids, perKey[k], "order of key %s", k)
	}
}

func TestConsumerEndToEnd(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, testConsumerEndToEnd)
}

func testConsumerEndToEnd(t *testing.T, kc *testenv.Kafka) {
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	topic := kc.Topic("billing.orders.v1")
	kc.CreateTopic(t, topic, 3)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 60, 6)
	produceEvents(t, prod, evs...)
	produceEvents(t, prod, evs[5]) // a republished duplicate

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	var handlerSpans sync.Map
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		handlerSpans.Store(ev.MessageID, trace.SpanContextFromContext(ctx))
		return fx.handler()(ctx, tx, ev)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("billing"), Topics: []string{topic},
		Store:          inbox.StoreConfig{Schema: db.Schema},
		TracerProvider: tp, MeterProvider: mp, OnCommitted: p.onCommitted,
	}, h)
	p.waitCommitted(t, topic, 61, 30*time.Second)
	r.stop(t)

	requireOncePerMessageInKeyOrder(t, fx, evs)
	st := r.c.Stats()
	require.EqualValues(t, 60, st.Processed)
	require.EqualValues(t, 1, st.Duplicates)
	require.EqualValues(t, 0, st.DeadLettered)
	require.EqualValues(t, 61, st.Committed)

	// The lag is measured from Kafka for the partitions a running member owns
	// (TestConsumerLagMeasuredFromKafka): the stopped consumer reports none.
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "keiro.consumer.lag" {
				require.Empty(t, g.DataPoints)
			}
		}
	}

	// Spans: one `process <topic>` per record, continuing the producer's trace.
	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "process "+topic {
			spans = append(spans, s)
		}
	}
	require.Len(t, spans, 61)
	s := spans[0]
	require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext().TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", s.Parent().SpanID().String())
	require.Len(t, s.Links(), 1)
	require.Equal(t, s.Parent().SpanID(), s.Links()[0].SpanContext.SpanID())
	attrs := map[string]string{}
	for _, a := range s.Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	require.Equal(t, "kafka", attrs["messaging.system"])
	require.Equal(t, "process", attrs["messaging.operation.type"])
	require.Equal(t, kc.Group("billing"), attrs["messaging.consumer.group.name"])
	require.Contains(t, []string{"processed", "duplicate"}, attrs["keiro.inbox.outcome"])
	require.NotEmpty(t, attrs["messaging.destination.partition.id"])
	require.NotEmpty(t, attrs["messaging.message.id"])
	require.NotEmpty(t, attrs["messaging.kafka.message.key"])
	sc, ok := handlerSpans.Load(evs[0].MessageID)
	require.True(t, ok)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", sc.(trace.SpanContext).TraceID().String(),
		"the handler's ctx carries the process span")
}

// dlqRecords reads n records from the dead-letter topic.
func dlqRecords(t testing.TB, kc *testenv.Kafka, topic string, n int) map[string]*kgo.Record {
	t.Helper()
	recs := kc.ConsumeRecords(t, n, 30*time.Second, topic)
	require.Len(t, recs, n)
	out := map[string]*kgo.Record{}
	for _, r := range recs {
		id := header(r, envelope.HeaderMessageID)
		if id == "" {
			id = header(r, inbox.HeaderDLQOffset)
		}
		out[id] = r
	}
	return out
}

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

func TestConsumerPoisonAndPermanentGoToDeadLetterTopic(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, testConsumerPoisonAndPermanentGoToDeadLetterTopic)
}

func testConsumerPoisonAndPermanentGoToDeadLetterTopic(t *testing.T, kc *testenv.Kafka) {
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	topic := kc.Topic("billing.payments.v1")
	kc.CreateTopic(t, topic, 2)
	kc.CreateTopic(t, topic+".dlq", 1)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 20, 4)
	poison, permanent := evs[3].MessageID, evs[11].MessageID
	produceEvents(t, prod, evs...)

	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if err := fx.handler()(ctx, tx, ev); err != nil {
			return err
		}
		switch ev.MessageID {
		case poison:
			return errors.New("ledger rejected the payment")
		case permanent:
			return inbox.Permanent(errors.New("unknown currency XXX"))
		}
		return nil
	}
	p := newProgress()
	var dlqMu sync.Mutex
	var dlqOrder []string
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("billing"), Topics: []string{topic},
		Store:       inbox.StoreConfig{Schema: db.Schema, MaxAttempts: 3},
		OnCommitted: p.onCommitted,
		OnDeadLettered: func(r *kgo.Record, reason string) {
			dlqMu.Lock()
			dlqOrder = append(dlqOrder, reason)
			dlqMu.Unlock()
		},
	}, h)
	p.waitCommitted(t, topic, 20, 30*time.Second)
	r.stop(t)

	st := r.c.Stats()
	require.EqualValues(t, 18, st.Processed)
	require.EqualValues(t, 2, st.DeadLettered)
	require.EqualValues(t, 4, st.HandlerFailures) // 3 for the poison, 1 for the permanent
	require.ElementsMatch(t, []string{inbox.ReasonPoisoned, inbox.ReasonPermanent}, dlqOrder)

	dlq := dlqRecords(t, kc, topic+".dlq", 2)
	pr := dlq[poison]
	require.NotNil(t, pr)
	require.Equal(t, inbox.ReasonPoisoned, header(pr, inbox.HeaderDLQReason))
	require.Equal(t, "3", header(pr, inbox.HeaderDLQAttempts))
	require.Contains(t, header(pr, inbox.HeaderDLQError), "ledger rejected")
	require.Equal(t, topic, header(pr, inbox.HeaderDLQTopic))
	require.Equal(t, kc.Group("billing"), header(pr, inbox.HeaderDLQConsumer))
	require.NotEmpty(t, header(pr, inbox.HeaderDLQPartition))
	require.NotEmpty(t, header(pr, inbox.HeaderDLQOffset))
	_, err := time.Parse(time.RFC3339Nano, header(pr, inbox.HeaderDLQAt))
	require.NoError(t, err)
	// Original key, value and headers travel unchanged.
	require.Equal(t, *evs[3].Key, string(pr.Key))
	require.Equal(t, evs[3].Payload, pr.Value)
	back, err := envelope.Decode(envelope.Record{Headers: func() []envelope.Header {
		var hs []envelope.Header
		for _, h := range pr.Headers {
			hs = append(hs, envelope.Header{Key: h.Key, Value: h.Value})
		}
		return hs
	}(), Value: pr.Value})
	require.NoError(t, err)
	require.Equal(t, evs[3].MessageID, back.MessageID)

	pe := dlq[permanent]
	require.NotNil(t, pe)
	require.Equal(t, inbox.ReasonPermanent, header(pe, inbox.HeaderDLQReason))
	require.Equal(t, "1", header(pe, inbox.HeaderDLQAttempts))
	require.Contains(t, header(pe, inbox.HeaderDLQError), "unknown currency")

	require.Equal(t, 0, fx.count(t, poison))
	require.Equal(t, 0, fx.count(t, permanent))
	failed, err := inbox.NewAdmin(r.c.Store()).ListFailed(context.Background(), db.Pool, inbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, failed, 2)
}

func TestConsumerBadRecordsGoToDeadLetterTopic(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.bad.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, "bad-letters", 1)
	prod := kc.NewClient(t)

	mutate := func(name string, set func(hs []kgo.RecordHeader) []kgo.RecordHeader) *kgo.Record {
		ev := newEvent("ordering", topic)
		r := toKgo(ev.Record(envelope.EncodeOptions{}))
		r.Headers = set(r.Headers)
		return r
	}
	replace := func(name, value string) func([]kgo.RecordHeader) []kgo.RecordHeader {
		return func(hs []kgo.RecordHeader) []kgo.RecordHeader {
			for i := range hs {
				if hs[i].Key == name {
					hs[i].Value = []byte(value)
					return hs
				}
			}
			return append(hs, kgo.RecordHeader{Key: name, Value: []byte(value)})
		}
	}
	drop := func(name string) func([]kgo.RecordHeader) []kgo.RecordHeader {
		return func(hs []kgo.RecordHeader) []kgo.RecordHeader {
			out := hs[:0]
			for _, h := range hs {
				if h.Key != name {
					out = append(out, h)
				}
			}
			return out
		}
	}
	bad := []struct {
		rec    *kgo.Record
		header string
	}{
		{mutate("missing source", drop(envelope.HeaderSource)), envelope.HeaderSource},
		{mutate("bad uuid", replace(envelope.HeaderCausationID, "not-a-uuid")), envelope.HeaderCausationID},
		{mutate("bad time", replace(envelope.HeaderOccurredAt, "yesterday")), envelope.HeaderOccurredAt},
		{mutate("bad json", replace(envelope.HeaderAttributes, "{nope")), envelope.HeaderAttributes},
		{mutate("bad int", replace(envelope.HeaderSchemaVersion, "v1")), envelope.HeaderSchemaVersion},
		{&kgo.Record{Topic: topic, Value: []byte("raw bytes, no headers")}, envelope.HeaderSource},
	}
	good := newEvent("ordering", topic)
	good.Payload = nil // an empty value is a valid (empty) payload
	for _, b := range bad {
		produce(t, prod, b.rec)
	}
	produceEvents(t, prod, good)

	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, DeadLetterTopic: "bad-letters",
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}, fx.handler())
	p.waitCommitted(t, topic, int64(len(bad)+1), 30*time.Second)
	r.stop(t)

	require.EqualValues(t, len(bad), r.c.Stats().DeadLettered)
	require.Equal(t, 1, fx.count(t, good.MessageID))
	dlq := kc.ConsumeRecords(t, len(bad), 30*time.Second, "bad-letters")
	require.Len(t, dlq, len(bad))
	for i, d := range dlq {
		require.Equal(t, inbox.ReasonDecode, header(d, inbox.HeaderDLQReason))
		require.Equal(t, fmt.Sprint(i), header(d, inbox.HeaderDLQOffset))
		require.Contains(t, header(d, inbox.HeaderDLQError), bad[i].header, "record %d", i)
		require.Equal(t, bad[i].rec.Value, d.Value)
	}
}

// A crash after the inbox commit but before the offset commit: the records are redelivered
// and classify as duplicates, so their effects stay single.
func TestConsumerRedeliveryAfterCrashIsDuplicate(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, testConsumerRedeliveryAfterCrashIsDuplicate)
}

func testConsumerRedeliveryAfterCrashIsDuplicate(t *testing.T, kc *testenv.Kafka) {
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	topic := kc.Topic("billing.crash.v1")
	kc.CreateTopic(t, topic, 1)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 10, 2)
	produceEvents(t, prod, evs...)

	// The "crashed" consumer: its inbox transactions for the first 4 records committed, its
	// offsets never did.
	group := kc.Group("billing") // the inbox is keyed per consumer, by default its group
	s := newStore(t, db, func(c *inbox.StoreConfig) { c.Consumer = group })
	for i, rec := range kc.ConsumeRecords(t, 4, 10*time.Second, topic)[:4] {
		ev, err := envelope.Decode(toEnvelope(rec))
		require.NoError(t, err)
		res, err := s.Process(ctx, db.Pool, inbox.Delivery{Event: ev, Kafka: &inbox.KafkaRef{Topic: topic, Offset: rec.Offset}}, fx.handler())
		require.NoError(t, err)
		require.Equal(t, inbox.Processed, res.Outcome, "record %d", i)
	}

	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: group, Topics: []string{topic},
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}, fx.handler())
	p.waitCommitted(t, topic, 10, 30*time.Second)
	r.stop(t)
	st := r.c.Stats()
	require.EqualValues(t, 4, st.Duplicates)
	require.EqualValues(t, 6, st.Processed)
	requireOncePerMessageInKeyOrder(t, fx, evs)
}

func toEnvelope(r *kgo.Record) envelope.Record {
	hs := make([]envelope.Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = envelope.Header{Key: h.Key, Value: h.Value}
	}
	return envelope.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp}
}

func TestConsumerBatchPathPoisonInTheMiddle(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.batch.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 30, 30)
	poison := evs[14].MessageID
	produceEvents(t, prod, evs...)
	produceEvents(t, prod, evs[2], evs[20]) // redeliveries inside a later batch

	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if err := fx.handler()(ctx, tx, ev); err != nil {
			return err
		}
		if ev.MessageID == poison {
			return errors.New("poison")
		}
		return nil
	}
	p := newProgress()
	r := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: 10,
		Store: inbox.StoreConfig{Schema: db.Schema, MaxAttempts: 2}, OnCommitted: p.onCommitted,
	}, h)
	p.waitCommitted(t, topic, 32, 30*time.Second)
	r.stop(t)
	st := r.c.Stats()
	require.EqualValues(t, 29, st.Processed)
	require.EqualValues(t, 2, st.Duplicates)
	require.EqualValues(t, 1, st.DeadLettered)
	for _, ev := range evs {
		want := 1
		if ev.MessageID == poison {
			want = 0
		}
		require.Equal(t, want, fx.count(t, ev.MessageID))
	}
	dlq := dlqRecords(t, kc, topic+".dlq", 1)
	require.Equal(t, "2", header(dlq[poison], inbox.HeaderDLQAttempts))
}

// A second member joins mid-stream, then the first leaves: nothing is lost, nothing runs
// twice, and the effects of each key keep their order.
func TestConsumerRebalanceMidStream(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, testConsumerRebalanceMidStream)
}

func testConsumerRebalanceMidStream(t *testing.T, kc *testenv.Kafka) {
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	topic := kc.Topic("billing.rebalance.v1")
	kc.CreateTopic(t, topic, 4)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 300, 12)
	p := newProgress()
	cfg := inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("billing"), Topics: []string{topic}, CommitEvery: 5,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
	}
	a := startConsumer(t, db.Pool, cfg, fx.handler())
	produceEvents(t, prod, evs[:100]...)
	p.waitCommitted(t, topic, 50, 30*time.Second)

	b := startConsumer(t, db.Pool, cfg, fx.handler())
	produceEvents(t, prod, evs[100:200]...)
	p.waitCommitted(t, topic, 150, 30*time.Second)

	a.stop(t)
	produceEvents(t, prod, evs[200:]...)
	p.waitCommitted(t, topic, 300, 60*time.Second)
	b.stop(t)

	requireOncePerMessageInKeyOrder(t, fx, evs)
	require.EqualValues(t, 300, a.c.Stats().Processed+b.c.Stats().Processed)
	require.Positive(t, b.c.Stats().Processed, "the second member took partitions over")
}

// Members join and leave while every partition has a backlog larger than its buffer, so the
// poll loops wait for room (and pause partitions) across revocations and assignments: every
// message still takes effect once, in key order.
func TestConsumerRebalanceWithFullBuffers(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, testConsumerRebalanceWithFullBuffers)
}

func testConsumerRebalanceWithFullBuffers(t *testing.T, kc *testenv.Kafka) {
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	topic := kc.Topic("billing.rebalance.full.v1")
	kc.CreateTopic(t, topic, 4)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 3000, 16)
	produceEvents(t, prod, evs[:2000]...)
	p := newProgress()
	cfg := inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("billing"), Topics: []string{topic},
		MaxBufferedRecords: 30, BatchSize: 10, CommitEvery: 50,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: p.onCommitted,
		KafkaOpts: []kgo.Opt{kgo.FetchMaxPartitionBytes(8 << 10)},
	}
	slow := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		time.Sleep(100 * time.Microsecond) // long enough for buffers to fill
		return fx.handler()(ctx, tx, ev)
	}
	a := startConsumer(t, db.Pool, cfg, slow)
	p.waitCommitted(t, topic, 300, 30*time.Second)
	b := startConsumer(t, db.Pool, cfg, slow)
	p.waitCommitted(t, topic, 900, 30*time.Second)
	a.stop(t)
	produceEvents(t, prod, evs[2000:]...)
	c := startConsumer(t, db.Pool, cfg, slow)
	p.waitCommitted(t, topic, 1800, 30*time.Second)
	b.stop(t)
	p.waitCommitted(t, topic, int64(len(evs)), 60*time.Second)
	c.stop(t)

	requireOncePerMessageInKeyOrder(t, fx, evs)
	require.EqualValues(t, len(evs), a.c.Stats().Processed+b.c.Stats().Processed+c.c.Stats().Processed)
}

func TestConsumerRecoversFromKilledDatabaseConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	kc := testenv.NewKafka(t)
	const topic = "billing.outage.v1"
	kc.CreateTopic(t, topic, 1)
	prod := kc.NewClient(t)
	evs := keyedEvents("ordering", topic, 20, 3)
	produceEvents(t, prod, evs...)

	app := "inbox_outage_" + strings.TrimPrefix(db.Schema, "t_")
	pool, err := pgxpool.New(ctx, db.ConnString+"&application_name="+app)
	require.NoError(t, err)
	defer pool.Close()

	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if ev.MessageID == evs[7].MessageID {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
		return fx.handler()(ctx, tx, ev)
	}
	p := newProgress()
	r := startConsumer(t, pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic},
		Store: inbox.StoreConfig{Schema: db.Schema, MaxAttempts: 2}, OnCommitted: p.onCommitted,
	}, h)
	<-entered
	var killed int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&killed))
	require.Positive(t, killed)
	close(release)
	p.waitCommitted(t, topic, 20, 30*time.Second)
	r.stop(t)

	// The dead connection shows either as a storage error (an inbox statement met it) or as a
	// handler failure that splits the batch (the handler's statement met it first: the records
	// before it commit again, it is retried alone); which one depends on timing, and neither
	// uses an attempt.
	st := r.c.Stats()
	require.EqualValues(t, 0, st.DeadLettered, "a database outage never dead-letters")
	require.EqualValues(t, 0, st.HandlerFailures, "a lost connection is not a handler attempt")
	requireOncePerMessageInKeyOrder(t, fx, evs)
}

func TestNewConsumerValidation(t *testing.T) {
	t.Parallel()
	_, err := inbox.NewConsumer(nil, inbox.ConsumerConfig{BatchSize: -1, Topics: []string{"("}, TopicsRegex: true,
		MaxBufferedRecords: -1, MaxBufferedBytes: -1}, nil)
	require.Error(t, err)
	for _, s := range []string{"pool", "handler", "Brokers", "Group", "BatchSize", "Topics", "MaxBufferedRecords", "MaxBufferedBytes"} {
		require.ErrorContains(t, err, s)
	}
}
