package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker" //nolint:depguard // a benchmark, not production code
	"github.com/keiro-go/keiro/keirotest/testenv/netproxy"    //nolint:depguard // a benchmark, not production code: the network between the parts
)

// The network between the parts (-net-latency) and a sidecar's CPU limit (-cpu-limit).
//
// With -net-latency d, every contender reaches PostgreSQL and each broker through a TCP proxy
// of its own (toxiproxy's, in this process, on loopback) that adds d each way, as a network
// between zones of a region would: the broker advertises its proxy, so every Kafka client,
// the harness's reader included, goes through it, while the harness's own enqueue and
// bookkeeping reach PostgreSQL directly (the service writing the outbox runs next to its
// database). It needs -kafka real: a broker of the user's or kfake cannot be made to
// advertise a proxy.
//
// With -cpu-limit c, each contender process runs in a cgroup (v1 cpu controller) whose CFS
// quota is c cores, as a sidecar's CPU limit in Kubernetes would hold it.

// startNetworkKafka starts the real broker behind proxies with latency each way and a proxy
// to PostgreSQL, and points the contenders at them.
func (p *parent) startNetworkKafka(ctx context.Context) (func(), error) {
	srv := netproxy.NewServer()
	u, err := url.Parse(p.o.dsn)
	if err != nil || u.Host == "" {
		srv.Close()
		return nil, fmt.Errorf("-net-latency: the PostgreSQL URL must name host:port to put a proxy in front of it (got %q)", p.o.dsn)
	}
	host := u.Host
	if u.Port() == "" {
		host += ":5432"
	}
	pg, err := srv.NewProxy(netproxy.ProxyConfig{Name: "postgres", Upstream: host, Latency: p.o.netLatency})
	if err != nil {
		srv.Close()
		return nil, err
	}
	if p.childDSN, err = pg.RewriteURL(p.o.dsn); err != nil {
		srv.Close()
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "  starting Apache Kafka %s (KRaft, one node) behind a proxy adding %s each way…\n", kafkabroker.Version, p.o.netLatency)
	k, err := netproxy.StartKafkaContext(ctx, srv, kafkabroker.Config{}, netproxy.ProxyConfig{Latency: p.o.netLatency})
	if err != nil {
		srv.Close()
		return nil, err
	}
	p.brokers, p.brokerPid = k.Seeds(), k.Cluster.Brokers[0].Pid()
	return func() { k.Cluster.Close(); srv.Close() }, nil
}

// cgroupRoot is the cgroup v1 cpu controller's hierarchy.
const cgroupRoot = "/sys/fs/cgroup/cpu"

// cfsPeriod is the CFS period of the contenders' cgroups: a quota of c cores is c × cfsPeriod
// of CPU time per period.
const cfsPeriod = 100 * time.Millisecond

// limitCPU moves process pid into a new cgroup of the cpu controller limited to cores, and
// returns what removes the cgroup once the process exited.
func limitCPU(pid int, cores float64) (func(), error) {
	dir := filepath.Join(cgroupRoot, fmt.Sprintf("keiro-peers-%d", pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("-cpu-limit: create the cgroup %s (the cgroup v1 cpu controller must be mounted and writable): %w", dir, err)
	}
	remove := func() {
		// The cgroup can be removed once its process exited; the kernel may take a moment.
		for range 50 {
			if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	quota := int64(cores * float64(cfsPeriod.Microseconds()))
	for _, w := range []struct{ file, value string }{
		{"cpu.cfs_period_us", strconv.FormatInt(cfsPeriod.Microseconds(), 10)},
		{"cpu.cfs_quota_us", strconv.FormatInt(quota, 10)},
		{"cgroup.procs", strconv.Itoa(pid)},
	} {
		if err := os.WriteFile(filepath.Join(dir, w.file), []byte(w.value), 0o644); err != nil {
			remove()
			return nil, fmt.Errorf("-cpu-limit: write %s of %s: %w", w.file, dir, err)
		}
	}
	return remove, nil
}

// networkNote describes -net-latency and -cpu-limit for the header line.
func networkNote(o options) string {
	var parts []string
	if o.netLatency > 0 {
		parts = append(parts, fmt.Sprintf("contenders reach PostgreSQL and the broker through proxies adding %s each way", o.netLatency))
	} else {
		parts = append(parts, "loopback")
	}
	if o.cpuLimit > 0 {
		parts = append(parts, fmt.Sprintf("each contender limited to %g cores (cgroup cpu quota)", o.cpuLimit))
	}
	return strings.Join(parts, ", ")
}
