package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestConsumerPollBeforeRevokeDoesNotReachTheNextAssignment: records from a poll taken before a
// revocation must not reach the worker of the same partition after it is assigned again: they
// would run ahead of the re-fetch from the committed offset and invert the partition's order.
// A consumer holds a poll of later records (offsets 5-9) while its workers are still on 0-4;
// a second member joins (eager range balancer: every partition is revoked, each member gets
// one). The held poll is released only once the rebalance completed (the second member
// commits) or the consumer reports that its poll is holding the rebalance back.
func TestConsumerPollBeforeRevokeDoesNotReachTheNextAssignment(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, testConsumerPollBeforeRevokeDoesNotReachTheNextAssignment)
}

func testConsumerPollBeforeRevokeDoesNotReachTheNextAssignment(t *testing.T, kc *testenv.Kafka) {
	db := testenv.NewDB(t)
	fx := newEffects(t, db)
	topic := kc.Topic("billing.stale-poll.v1")
	kc.CreateTopic(t, topic, 2)
	prod := kc.NewClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	events := func(from, to int) ([]envelope.Event, []*kgo.Record) {
		var evs []envelope.Event
		var recs []*kgo.Record
		for p := range int32(2) {
			for i := from; i < to; i++ {
				ev := newEvent("ordering", topic)
				k := fmt.Sprintf("p%d", p)
				ev.Key = &k
				ev.Payload = []byte(fmt.Sprintf(`{"offset":%d}`, i))
				evs = append(evs, ev)
				r := toKgo(ev.Record(envelope.EncodeOptions{}))
				r.Partition = p
				recs = append(recs, r)
			}
		}
		return evs, recs
	}
	first, recs := events(0, 5)
	produce(t, prod, recs...)

	gate := make(chan struct{}) // closed when the held poll is released
	var seen sync.WaitGroup
	seen.Add(1)
	held, release := make(chan struct{}), make(chan struct{})
	var once, firstOnce sync.Once
	var n int
	hook := func(f kgo.Fetches) {
		later := false
		f.EachRecord(func(r *kgo.Record) {
			if r.Offset >= 5 {
				later = true
			} else {
				n++
			}
		})
		if n >= 10 {
			firstOnce.Do(seen.Done)
		}
		if later {
			once.Do(func() {
				close(held)
				<-release
			})
		}
	}
	gated := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		return fx.handler()(ctx, tx, ev)
	}
	blocked := make(chan struct{}, 1)
	pa := newProgress()
	a := startConsumerWith(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("billing"), Topics: []string{topic}, BatchSize: 1,
		ShutdownTimeout: 300 * time.Millisecond,
		Store:           inbox.StoreConfig{Schema: db.Schema}, OnCommitted: pa.onCommitted,
		KafkaOpts: []kgo.Opt{kgo.Balancers(kgo.RangeBalancer()),
			kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) {
				select {
				case blocked <- struct{}{}:
				default:
				}
			})},
	}, gated, func(c *inbox.Consumer) { inbox.SetPollHook(c, hook) })
	seen.Wait()
	second, recs := events(5, 10)
	produce(t, prod, recs...)
	<-held

	pb := newProgress()
	bChanged := pb.of(topic).Changed() // before b starts: its first commit closes it
	b := startConsumer(t, db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("billing"), Topics: []string{topic}, BatchSize: 1,
		Store: inbox.StoreConfig{Schema: db.Schema}, OnCommitted: pb.onCommitted,
		KafkaOpts: []kgo.Opt{kgo.Balancers(kgo.RangeBalancer())},
	}, fx.handler())
	select {
	case <-bChanged: // the rebalance completed under the held poll
	case <-blocked: // the held poll holds the rebalance back
	case <-time.After(30 * time.Second):
		t.Fatal("neither a completed rebalance nor a held one")
	}
	close(gate)
	close(release)

	deadline := time.Now().Add(30 * time.Second)
	for fx.count(t, "") < 20 && time.Now().Before(deadline) {
		select {
		case <-pa.of(topic).Changed():
		case <-pb.of(topic).Changed():
		case <-time.After(100 * time.Millisecond):
		}
	}
	a.stop(t)
	b.stop(t)
	requireOncePerMessageInKeyOrder(t, fx, append(first, second...))
}
