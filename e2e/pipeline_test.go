package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/schema"
)

const counterAvro = `{"type":"record","name":"Counted","namespace":"keiro.e2e","fields":[{"name":"seq","type":"long"}]}`

// TestPipeline runs outbox → relay binary → Kafka → consumer binary → inbox + effects, with
// JSON payloads and with Avro payloads through the real schema registry (Apicurio), and a
// poison message that must be dead-lettered without holding anything else back; on the
// embedded broker and on a real one.
func TestPipeline(t *testing.T) {
	t.Parallel()
	for _, avro := range []bool{false, true} {
		name := "json"
		if avro {
			name = "avro"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eachKafka(t, func(t *testing.T, kc *testenv.Kafka) { testPipeline(t, kc, avro) })
		})
	}
}

func testPipeline(t *testing.T, kc *testenv.Kafka, avro bool) {
	ctx := context.Background()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	name := "e2e.counted.v1"
	var reg *testenv.SchemaRegistry
	if avro {
		reg = testenv.NewSchemaRegistry(t)
		name = reg.Name(name) // the topic's subject is the test's own on the shared registry
	}
	topic, group := kc.Topic(name), kc.Group("effects")
	kc.CreateTopic(t, topic, 3)
	kc.CreateTopic(t, topic+".dlq", 1)

	var extraConsumer []string
	encode := func(ev *envelope.Event, seq int64) {}
	if avro {
		r, err := schema.NewRegistry(schema.RegistryConfig{URL: reg.URL})
		require.NoError(t, err)
		ser, err := schema.NewSerializer(r, counterAvro, schema.SerializerConfig{AutoRegister: true})
		require.NoError(t, err)
		encode = func(ev *envelope.Event, seq int64) {
			require.NoError(t, ser.Encode(ctx, ev, map[string]any{"seq": seq}))
		}
		extraConsumer = append(extraConsumer, "KEIRO_CONSUMER_SCHEMA_REGISTRY_URL="+reg.URL)
	}

	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	want := map[string]int64{}
	var evs []envelope.Event
	for seq := int64(1); seq <= 30; seq++ {
		for k := range 10 {
			key := fmt.Sprintf("k%02d", k)
			ev := keyedEvent(topic, key, seq)
			encode(&ev, seq)
			evs = append(evs, ev)
			want[key] = seq
		}
	}
	poison := keyedEvent(topic, "poison", -1)
	encode(&poison, -1)
	evs = append(evs[:150:150], append([]envelope.Event{poison}, evs[150:]...)...)
	require.NoError(t, enqueue(ctx, db.Pool, ob, evs...))

	relay := startProc(t, "relay", relayBin, relayAddrRe, relayEnv(db, kc))
	cons := startProc(t, "consumer", consumerBin, consumerAddrRe, consumerEnv(db, kc, group, topic, extraConsumer...))
	raddr, caddr := relay.waitAddr(t, 30*time.Second), cons.waitAddr(t, 30*time.Second)

	adm := kadm.NewClient(kc.Client)
	// The condition is the signal (the binaries are other processes); the tick bounds polling.
	require.Eventually(t, func() bool {
		var n int64
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.effects`).Scan(&n)
		return n >= 300 && committedAll(ctx, adm, group, topic)
	}, 60*time.Second, 50*time.Millisecond, "effects applied and offsets committed\nrelay:\n%s\nconsumer:\n%s", relay.log(), cons.log())

	dlq := consumeAll(t, kc, 1, 30*time.Second, topic+".dlq")
	require.Len(t, dlq, 1)
	require.Equal(t, "poison", string(dlq[0].Key))
	require.Equal(t, poison.Payload, dlq[0].Value, "the original bytes are dead-lettered")
	hdr := map[string]string{}
	for _, h := range dlq[0].Headers {
		hdr[h.Key] = string(h.Value)
	}
	require.Equal(t, inbox.ReasonPermanent, hdr[inbox.HeaderDLQReason])
	require.Equal(t, poison.MessageID, hdr[envelope.HeaderMessageID])

	published, err := metric(raddr, "keiro_outbox_published_total")
	require.NoError(t, err)
	require.Equal(t, float64(301), published, "relay /metrics")
	processed, err := metric(caddr, "keiro_inbox_processed_total")
	require.NoError(t, err)
	require.Equal(t, float64(300), processed, "consumer /metrics")

	require.Equal(t, 0, cons.term(t, 30*time.Second), cons.log())
	require.Equal(t, 0, relay.term(t, 30*time.Second), relay.log())

	o := readOutcome(t, db, kc, topic, want)
	require.Equal(t, int64(300), o.effects)
	require.Equal(t, int64(300), o.distinct)
	require.Empty(t, o.orderViolations)
	require.Zero(t, o.outboxNotSent, "%v", o.outboxByStatus)
	require.Equal(t, int64(1), o.inboxNotCompleted, "only the poison message is a failed inbox row")
	require.Equal(t, int64(301), o.topicRecords)
}
