package netproxy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
	"github.com/keiro-go/keiro/keirotest/testenv/netproxy"
)

// TestStartKafkaPutsAProxyInFrontOfEachBroker: a three-broker cluster, each broker behind a proxy
// it advertises. A client seeded with the proxies is sent by metadata to the proxies only, and
// produces to and consumes from a topic replicated three times through them (the brokers
// replicate among themselves on their own listeners).
func TestStartKafkaPutsAProxyInFrontOfEachBroker(t *testing.T) {
	t.Parallel()
	k := netproxy.StartKafka(t, netproxy.New(t), kafkabroker.Config{Brokers: 3}, netproxy.ProxyConfig{})
	require.Len(t, k.Proxies, 3)
	require.Equal(t, len(k.Cluster.Brokers), len(k.Seeds()))
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Seeds()...), kgo.DefaultProduceTopic("proxied"),
		kgo.ConsumeTopics("proxied"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adm := kadm.NewClient(cl)
	meta, err := adm.BrokerMetadata(ctx)
	require.NoError(t, err)
	var got []string
	for _, b := range meta.Brokers {
		got = append(got, fmt.Sprintf("%s:%d", b.Host, b.Port))
	}
	var proxies []string
	for i, p := range k.Proxies {
		proxies = append(proxies, p.Addr())
		require.Equal(t, p.Upstream(), k.Cluster.Brokers[i].External)
		require.NotEqual(t, p.Addr(), k.Cluster.Brokers[i].Addr)
	}
	require.ElementsMatch(t, proxies, got, "metadata names the proxies, not the brokers")

	resp, err := adm.CreateTopic(ctx, 3, 3, nil, "proxied")
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	for i := range 30 {
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Key: []byte{byte(i % 3)}, Value: []byte{byte(i)}}).FirstErr())
	}
	n := 0
	for n < 30 {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		fs.EachRecord(func(*kgo.Record) { n++ })
	}
	require.Equal(t, 30, n)
}
