package inbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
	"github.com/keiro-go/keiro/keirotest/testenv/netproxy"
)

// Network faults between the consumer and its two peers, on a real broker and a real
// PostgreSQL, each reached through a proxy (keirotest/testenv/netproxy) that adds 1ms each way.
// Each case checks that every message has exactly one effect and that each key's effects ran in
// produce order.
const (
	netMessages = 200
	netKeys     = 20
	netDeadline = 90 * time.Second
)

// TestConsumerNetworkFaults runs the consumer through proxies that fail the network under it:
// its PostgreSQL connections reset as a message's transaction commits (the commit lands, its
// reply is lost), the broker blackholed, and the broker's bandwidth cut to a trickle. The cases
// share one real broker, behind a proxy it advertises, and run one after the other.
func TestConsumerNetworkFaults(t *testing.T) {
	t.Parallel()
	srv := netproxy.New(t)
	kafka := netproxy.StartKafka(t, srv, kafkabroker.Config{Props: map[string]string{"auto.create.topics.enable": "false"}},
		netproxy.ProxyConfig{})
	kc := testenv.NewKafkaWith(t, testenv.KafkaConfig{Real: true, Brokers: kafka.Cluster.Seeds()})
	type rig struct {
		db    *testenv.DB
		fx    *effects
		pg    *netproxy.Proxy
		pool  *pgxpool.Pool // the consumer's, through pg
		topic string
		evs   []envelope.Event
	}
	setup := func(t *testing.T, partitions int32) *rig {
		t.Helper()
		db := testenv.NewDB(t)
		r := &rig{db: db, fx: newEffects(t, db), topic: kc.Topic("net." + db.Schema)}
		kc.CreateTopic(t, r.topic, partitions)
		cc := db.Pool.Config().ConnConfig
		r.pg = srv.Proxy(t, netproxy.ProxyConfig{Upstream: fmt.Sprintf("%s:%d", cc.Host, cc.Port)})
		url, err := r.pg.RewriteURL(db.ConnString)
		require.NoError(t, err)
		r.pool, err = pgxpool.New(context.Background(), url)
		require.NoError(t, err)
		t.Cleanup(r.pool.Close)
		r.evs = keyedEvents("net", r.topic, netMessages, netKeys)
		return r
	}
	config := func(r *rig, p *progress, opts ...kgo.Opt) inbox.ConsumerConfig {
		return inbox.ConsumerConfig{Brokers: kafka.Seeds(), Group: kc.Group(r.db.Schema), Topics: []string{r.topic},
			Store: inbox.StoreConfig{Schema: r.db.Schema, Consumer: "net"}, OnCommitted: p.onCommitted,
			KafkaOpts: append(testenv.FastRetries(), opts...)}
	}

	for _, tc := range []struct {
		name  string
		batch int
	}{{"pg-reset-mid-commit", 1}, {"pg-reset-mid-batch", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			r := setup(t, 1)
			produceEvents(t, kc.Client, r.evs...)
			// One partition. With one message per transaction, the handler's middle call
			// arms a reset of every connection's next reply, its transaction's commit's (the
			// commit lands, its reply is lost); with the default batches, the reply of the
			// batch's next statement or of its commit. The fault is removed once the
			// consumer counted the failure.
			var calls atomic.Int64
			faults := make(chan *netproxy.Toxic, 1)
			h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
				if err := r.fx.handler()(ctx, tx, ev); err != nil {
					return err
				}
				if calls.Add(1) == netMessages/2 {
					x, err := r.pg.Inject(netproxy.ResetPeer(0).Toward(netproxy.Downstream))
					if err != nil {
						return err
					}
					faults <- x
				}
				return nil
			}
			p := newProgress()
			cfg := config(r, p)
			cfg.BatchSize = tc.batch
			c := startConsumer(t, r.pool, cfg, h)
			var x *netproxy.Toxic
			select {
			case x = <-faults:
			case <-time.After(netDeadline):
				t.Fatal("the consumer never reached the middle message")
			}
			testenv.WaitFor(t, netDeadline, "the consumer to count the failure", func() bool {
				return c.c.Stats().StorageErrors > 0
			})
			require.NoError(t, x.Remove())
			p.waitCommitted(t, r.topic, netMessages, netDeadline)
			s := c.c.Stats()
			t.Logf("consumer: %+v", s)
			if tc.batch == 1 {
				require.Positive(t, s.Duplicates, "the message whose commit landed was found processed when retried")
			}
			requireOncePerMessageInKeyOrder(t, r.fx, r.evs)
		})
	}

	for _, tc := range []struct {
		name  string
		fault netproxy.Fault
	}{{"broker-blackholed", netproxy.Blackhole()}, {"broker-trickle", netproxy.Bandwidth(2)}} {
		t.Run(tc.name, func(t *testing.T) {
			r := setup(t, 4)
			var writes atomic.Int64
			var handled atomic.Int64
			h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
				handled.Add(1)
				return r.fx.handler()(ctx, tx, ev)
			}
			p := newProgress()
			startConsumer(t, r.pool, config(r, p, kgo.WithHooks(brokerWrites(func() { writes.Add(1) }))), h)
			produceEvents(t, kc.Client, r.evs[:netMessages/2]...)
			p.waitCommitted(t, r.topic, netMessages/2, netDeadline)

			x := kafka.Proxies[0].MustInject(t, tc.fault)
			writesBefore, handledBefore := writes.Load(), handled.Load()
			produceEvents(t, kc.Client, r.evs[netMessages/2:]...) // directly: the fault is the consumer's
			// Through a blackhole the consumer's requests (heartbeats, fetches) go out and
			// nothing comes back; through the trickle records arrive, slowly.
			testenv.WaitFor(t, netDeadline, "the consumer working through the fault", func() bool {
				if tc.fault.Type == "bandwidth" {
					return handled.Load() > handledBefore // the trickle lets records through
				}
				return writes.Load() > writesBefore
			})
			if tc.fault.Type != "bandwidth" {
				require.Equal(t, handledBefore, handled.Load(), "no message through the blackhole")
			}
			require.NoError(t, x.Remove())
			p.waitCommitted(t, r.topic, netMessages, netDeadline)
			requireOncePerMessageInKeyOrder(t, r.fx, r.evs)
		})
	}
}

// brokerWrites is a kgo hook calling f after each request written to a broker.
type brokerWrites func()

func (f brokerWrites) OnBrokerWrite(_ kgo.BrokerMetadata, _ int16, _ int, _, _ time.Duration, err error) {
	if err == nil {
		f()
	}
}
