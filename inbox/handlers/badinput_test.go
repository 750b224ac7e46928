package handlers

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/schema"
)

// TestHTTPBadHeaderInputDoesNotStopThePartition runs records through the consumer, on one
// partition: a message whose id carries a newline (an Idempotency-Key the HTTP client refuses)
// is dead-lettered with reason "permanent", and the records behind it reach the service exactly
// once. In cloudevents-binary mode a record with a binary Kafka key goes first and is delivered,
// its key percent-encoded in ce-partitionkey.
func TestHTTPBadHeaderInputDoesNotStopThePartition(t *testing.T) {
	t.Parallel()
	for _, format := range []string{FormatKeiro, FormatCloudEventsBinary} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			testBadHeaderInput(t, format)
		})
	}
}

func testBadHeaderInput(t *testing.T, format string) {
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	const topic = "billing.headers.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)

	binaryKey := string([]byte{0xff, 0x00, 0x0a, 0x80})
	var evs []envelope.Event
	add := func(id string, key *string) {
		ev := testEvent()
		ev.MessageID, ev.Key = id, key
		evs = append(evs, ev)
	}
	if format == FormatCloudEventsBinary {
		add("binary-key", &binaryKey)
	}
	add("bad\nid-1", nil)
	add("good-1", nil)
	add("good-2", nil)
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		r := ev.Record(envelope.EncodeOptions{})
		hs := make([]kgo.RecordHeader, len(r.Headers))
		for j, h := range r.Headers {
			hs[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
		recs[i] = &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: hs}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, kc.NewClient(t).ProduceSync(ctx, recs...).FirstErr())

	var (
		smu       sync.Mutex
		delivered = map[string]int{}
		keys      = map[string]string{}
	)
	srv, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		smu.Lock()
		defer smu.Unlock()
		id := r.Header.Get(HeaderIdempotencyKey)
		delivered[id]++
		if k := r.Header.Get("Ce-Partitionkey"); k != "" {
			keys[id], _ = url.PathUnescape(k)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	h := newHTTP(t, srv.URL, func(c *HTTPConfig) { c.Format = format })

	var (
		mu        sync.Mutex
		committed int64
		dead      = map[string]string{} // message id → reason
	)
	n := int64(len(recs))
	allCommitted := make(chan struct{})
	c, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: 1,
		Store:  inbox.StoreConfig{Schema: db.Schema, Consumer: "billing", MaxAttempts: 3},
		Retry:  keiro.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Logger: slog.New(slog.DiscardHandler),
		KafkaOpts: []kgo.Opt{kgo.HeartbeatInterval(100 * time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
		OnCommitted: func(cm inbox.Commit) {
			mu.Lock()
			defer mu.Unlock()
			if committed < n && cm.Offset >= n {
				close(allCommitted)
			}
			committed = max(committed, cm.Offset)
		},
		OnDeadLettered: func(r *kgo.Record, reason string) {
			mu.Lock()
			defer mu.Unlock()
			for _, hd := range r.Headers {
				if hd.Key == envelope.HeaderMessageID {
					dead[string(hd.Value)] = reason
				}
			}
		},
	}, h.Handle)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	select {
	case <-allCommitted:
	case <-time.After(30 * time.Second):
		t.Fatalf("the partition did not move past the bad record: stats %+v", c.Stats())
	}
	mu.Lock()
	require.Equal(t, map[string]string{"bad\nid-1": inbox.ReasonPermanent}, dead)
	mu.Unlock()
	require.Zero(t, c.Stats().Deferred, "no outage was reported")

	smu.Lock()
	defer smu.Unlock()
	want := map[string]int{"billing:ordering:good-1": 1, "billing:ordering:good-2": 1}
	if format == FormatCloudEventsBinary {
		want["billing:ordering:binary-key"] = 1
		require.Equal(t, binaryKey, keys["billing:ordering:binary-key"], "the binary key arrives intact")
	}
	require.Equal(t, want, delivered)

	dlq := readDLQ(t, kc, topic+".dlq")
	require.Equal(t, inbox.ReasonPermanent, dlq[inbox.HeaderDLQReason])
	require.Contains(t, dlq[inbox.HeaderDLQError], HeaderIdempotencyKey)
}

// readDLQ reads the one record of the dead-letter topic and returns its headers.
func readDLQ(t *testing.T, kc *testenv.Kafka, topic string) map[string]string {
	t.Helper()
	cl := kc.NewClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "no dead-letter record")
		var hs map[string]string
		fs.EachRecord(func(r *kgo.Record) {
			hs = map[string]string{}
			for _, h := range r.Headers {
				hs[h.Key] = string(h.Value)
			}
		})
		if hs != nil {
			return hs
		}
	}
}

// TestSchemaEventHookMalformedAvroIsDeadLettered: schema.Deserializer.EventHook as the
// consumer's SchemaDecoder, on the real schema registry (Apicurio). An Avro record with a schema
// id the registry does not know (its 40403) can never decode: it is dead-lettered with reason
// "schema", and the Avro record behind it, written by our serializer against the registry, reaches
// the handler as JSON. Before, the undecodable record's error was not marked permanent, so the
// consumer retried it forever ("schema decoding failed; retrying") and the partition never moved.
func TestSchemaEventHookMalformedAvroIsDeadLettered(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	const topic = "billing.avro.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)

	registry := testenv.NewSchemaRegistry(t)
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: registry.URL, MaxAttempts: 1, RequestTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(reg.Close)
	des, err := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	require.NoError(t, err)
	ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{AutoRegister: true})
	require.NoError(t, err)

	bad, good := testEvent(), testEvent()
	bad.MessageID, bad.ContentType = "unknown-schema", "application/vnd.confluent.avro"
	bad.Payload = append(schema.AppendFrameHeader(nil, 2_000_000_000), 2, 'x')
	good.MessageID = "good"
	good.Destination = registry.Name(topic) // its subject is the test's own
	require.NoError(t, ser.Encode(context.Background(), &good, map[string]any{"id": "o-1", "amount": int64(42)}))
	good.Destination = topic
	var recs []*kgo.Record
	for _, ev := range []envelope.Event{bad, good} {
		r := ev.Record(envelope.EncodeOptions{})
		hs := make([]kgo.RecordHeader, len(r.Headers))
		for j, h := range r.Headers {
			hs[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: hs})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, kc.NewClient(t).ProduceSync(ctx, recs...).FirstErr())

	var (
		mu      sync.Mutex
		handled []string
		payload = map[string]string{}
		dead    = map[string]string{}
	)
	committed := make(chan struct{})
	var once sync.Once
	c, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: 1,
		Store:         inbox.StoreConfig{Schema: db.Schema, Consumer: "billing", MaxAttempts: 3},
		Retry:         keiro.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Logger:        slog.New(slog.DiscardHandler),
		SchemaDecoder: des.EventHook(),
		KafkaOpts: []kgo.Opt{kgo.HeartbeatInterval(100 * time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
		OnCommitted: func(cm inbox.Commit) {
			if cm.Offset >= 2 {
				once.Do(func() { close(committed) })
			}
		},
		OnDeadLettered: func(r *kgo.Record, reason string) {
			mu.Lock()
			defer mu.Unlock()
			for _, hd := range r.Headers {
				if hd.Key == envelope.HeaderMessageID {
					dead[string(hd.Value)] = reason
				}
			}
		},
	}, func(_ context.Context, _ pgx.Tx, ev envelope.Event) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, ev.MessageID)
		payload[ev.MessageID] = ev.ContentType + " " + string(ev.Payload)
		return nil
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	select {
	case <-committed:
	case <-time.After(30 * time.Second):
		t.Fatalf("the partition did not move past the undecodable Avro record: stats %+v", c.Stats())
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]string{"unknown-schema": inbox.ReasonSchema}, dead)
	require.Equal(t, []string{"good"}, handled)
	ct, js, _ := strings.Cut(payload["good"], " ")
	require.Equal(t, envelope.ContentTypeJSON, ct, "the Avro record reaches the handler as JSON")
	require.JSONEq(t, `{"id":"o-1","amount":42}`, js)
}
