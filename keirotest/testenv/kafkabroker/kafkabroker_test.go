package kafkabroker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
)

// produceConsume produces n records under a key of its own and reads the topic from the
// start until it has seen them all, in order.
func produceConsume(t *testing.T, seeds []string, topic string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic),
		kgo.AllowAutoTopicCreation(), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	key := []byte(time.Now().Format(time.RFC3339Nano))
	for i := range n {
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Key: key, Value: []byte{byte(i)}}).FirstErr())
	}
	var got []byte
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		require.NoError(t, fs.Err())
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) == string(key) {
				got = append(got, r.Value...)
			}
		})
	}
	for i, v := range got {
		require.Equal(t, byte(i), v, "record %d of %d", i, n)
	}
}

func TestSingleBroker(t *testing.T) {
	c, err := kafkabroker.Start(context.Background(), kafkabroker.Config{})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.Len(t, c.Seeds(), 1)
	require.Nil(t, c.Controller)
	produceConsume(t, c.Seeds(), "single", 10)

	// Pid names the broker's JVM.
	b := c.Brokers[0]
	pid := b.Pid()
	require.Positive(t, pid)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	require.NoError(t, err)
	require.Contains(t, string(cmdline), "kafka.Kafka")

	// Killed and restarted on the same port and data, it still has the records, under a new
	// process.
	require.NoError(t, b.Kill())
	require.False(t, b.Running())
	require.NoError(t, b.Restart(context.Background()))
	require.NotEqual(t, pid, b.Pid())
	produceConsume(t, c.Seeds(), "single", 10)
}

func TestCluster(t *testing.T) {
	c, err := kafkabroker.Start(context.Background(), kafkabroker.Config{Brokers: 3})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.Len(t, c.Seeds(), 3)
	require.NotNil(t, c.Controller)

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Seeds()...))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	resp, err := adm.CreateTopic(ctx, 3, -1, nil, "replicated")
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	// A topic reaches the brokers' metadata shortly after CreateTopics answers, and each broker
	// learns of it on its own: wait until the one asked lists every partition with a leader and
	// describes the topic's configuration.
	var (
		cfgs kadm.ResourceConfigs
		td   kadm.TopicDetails
	)
	require.Eventually(t, func() bool {
		if td, err = adm.ListTopics(ctx, "replicated"); err != nil || len(td["replicated"].Partitions) != 3 {
			return false
		}
		for _, p := range td["replicated"].Partitions {
			if p.Leader < 0 || p.Err != nil {
				return false
			}
		}
		cfgs, err = adm.DescribeTopicConfigs(ctx, "replicated")
		return err == nil && cfgs[0].Err == nil
	}, 30*time.Second, 50*time.Millisecond, "the new topic's partitions and configuration: %v", err)
	for _, p := range td["replicated"].Partitions {
		require.Len(t, p.Replicas, 3, "default.replication.factor is 3")
	}
	minISR := ""
	for _, c := range cfgs[0].Configs {
		if c.Key == "min.insync.replicas" && c.Value != nil {
			minISR = *c.Value
		}
	}
	require.Equal(t, "2", minISR)
	produceConsume(t, c.Seeds(), "replicated", 20)

	// One broker down: acks=all still succeeds with min.insync.replicas=2.
	require.NoError(t, c.Brokers[0].Kill())
	produceConsume(t, c.Seeds()[1:], "replicated", 20)
	require.NoError(t, c.Brokers[0].Restart(ctx))
	require.NoError(t, c.Brokers[1].Pause())
	require.NoError(t, c.Brokers[1].Resume())

	// Two of three brokers down: once the controller has fenced them, acks=all produces are
	// refused with NOT_ENOUGH_REPLICAS (min.insync.replicas=2), which kfake never answers.
	// Not idempotent: an idempotent producer never gives up on a batch it may have written to a
	// broker that died (it would wait for the broker's return), and this one must get an answer.
	pc, err := kgo.NewClient(kgo.SeedBrokers(c.Seeds()...), kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordRetries(2), kgo.RecordDeliveryTimeout(20*time.Second))
	require.NoError(t, err)
	defer pc.Close()
	require.NoError(t, pc.ProduceSync(ctx, &kgo.Record{Topic: "replicated", Value: []byte("a")}).FirstErr())
	require.NoError(t, c.Brokers[0].Kill())
	require.NoError(t, c.Brokers[1].Kill())
	var last error
	for range 5 { // the first produces may meet the dead leaders before they are fenced
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		last = pc.ProduceSync(pctx, &kgo.Record{Topic: "replicated", Value: []byte("b")}).FirstErr()
		cancel()
		if errors.Is(last, kerr.NotEnoughReplicas) {
			break
		}
	}
	require.ErrorIs(t, last, kerr.NotEnoughReplicas)
}
