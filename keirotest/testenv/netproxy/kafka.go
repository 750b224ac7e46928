package netproxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
)

// Kafka is a real Kafka cluster (kafkabroker) whose clients reach every broker through a proxy
// of its own: each broker advertises its proxy (kafkabroker.Config.Advertise), so metadata
// sends a client seeded with Seeds through the proxies, while the brokers talk to each other
// directly.
type Kafka struct {
	// Cluster is the running cluster, for its nodes (kill, pause, restart).
	Cluster *kafkabroker.Cluster
	// Proxies are the brokers' proxies, in the order of Cluster.Brokers.
	Proxies []*Proxy
}

// StartKafka starts a cluster as kafkabroker.Start does, each broker behind a proxy of s with
// proxy's settings (its Upstream and Name are set per broker), and stops it when t ends.
// cfg.Advertise must be nil: StartKafka sets it.
func StartKafka(t testing.TB, s *Server, cfg kafkabroker.Config, proxy ProxyConfig) *Kafka {
	t.Helper()
	k, err := StartKafkaContext(context.Background(), s, cfg, proxy)
	if err != nil {
		t.Fatalf("netproxy: %v", err)
	}
	t.Cleanup(k.Cluster.Close)
	return k
}

// StartKafkaContext is StartKafka for code without a test at hand (a benchmark command): the
// caller stops the cluster (Cluster.Close) and the proxies (Server.Close).
func StartKafkaContext(ctx context.Context, s *Server, cfg kafkabroker.Config, proxy ProxyConfig) (*Kafka, error) {
	if cfg.Advertise != nil {
		return nil, errors.New("start Kafka behind proxies: Config.Advertise is set by StartKafka")
	}
	var (
		mu      sync.Mutex
		proxies = map[int32]*Proxy{}
	)
	cfg.Advertise = func(id int32, external string) (string, error) {
		pc := proxy
		pc.Upstream = external
		if pc.Name == "" {
			pc.Name = fmt.Sprintf("kafka-%d", id)
		} else {
			pc.Name = fmt.Sprintf("%s-%d", pc.Name, id)
		}
		p, err := s.NewProxy(pc)
		if err != nil {
			return "", err
		}
		mu.Lock()
		proxies[id] = p
		mu.Unlock()
		return p.Addr(), nil
	}
	c, err := kafkabroker.Start(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("start Kafka behind proxies: %w", err)
	}
	k := &Kafka{Cluster: c}
	for _, b := range c.Brokers {
		k.Proxies = append(k.Proxies, proxies[b.ID])
	}
	return k, nil
}

// Seeds returns the proxies' addresses, which the brokers advertise: seed a client with them.
func (k *Kafka) Seeds() []string { return k.Cluster.AdvertisedSeeds() }

// Inject adds f to every broker's proxy (Proxy.Inject); the Toxic removes it from all.
func (k *Kafka) Inject(f Fault) (*Toxic, error) {
	all := &Toxic{}
	var subs []*Toxic
	for _, p := range k.Proxies {
		x, err := p.Inject(f)
		if err != nil {
			for _, s := range subs {
				_ = s.Remove()
			}
			return nil, err
		}
		subs = append(subs, x)
	}
	all.subs = subs
	return all, nil
}
