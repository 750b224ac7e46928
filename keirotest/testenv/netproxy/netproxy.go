package netproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// DefaultLatency is the latency a proxy adds each way unless its ProxyConfig says otherwise:
// 1ms, about a round trip between two zones of a cloud region.
const DefaultLatency = time.Millisecond

// Server runs toxiproxy's proxies in the test process. Its methods are safe for concurrent use.
type Server struct {
	api *toxiproxy.ApiServer
	mu  sync.Mutex
	all []*Proxy
}

// quiet is set once: toxiproxy's toxics log through zerolog's global logger.
var quiet sync.Once

// New returns a Server whose proxies are closed when t ends.
func New(t testing.TB) *Server {
	t.Helper()
	s := NewServer()
	t.Cleanup(s.Close)
	return s
}

// NewServer returns a Server that lives until Close, for proxies shared beyond one test (a
// broker started once for several tests).
func NewServer() *Server {
	quiet.Do(func() {
		// The toxics log a warning when a connection they hold closes under them: what every
		// fault of these tests does on purpose.
		zerolog.SetGlobalLevel(zerolog.ErrorLevel)
	})
	m := toxiproxy.NewMetricsContainer(prometheus.NewRegistry())
	return &Server{api: toxiproxy.NewServer(m, zerolog.Nop())}
}

// Close stops every proxy of s and closes their connections. Safe to call more than once.
func (s *Server) Close() {
	s.mu.Lock()
	all := s.all
	s.all = nil
	s.mu.Unlock()
	for _, p := range all {
		p.p.Stop()
	}
}

// ProxyConfig configures Server.Proxy.
type ProxyConfig struct {
	// Name names the proxy, unique in its Server. Defaults to "proxy-<n>".
	Name string
	// Upstream is the host:port the proxy forwards to. Required.
	Upstream string
	// Listen is the host:port the proxy listens on. Defaults to a free loopback port.
	Listen string
	// Latency is added each way to every connection, as the proxy's baseline network;
	// negative adds none. Defaults to DefaultLatency.
	Latency time.Duration
}

// Proxy is one TCP proxy of a Server.
type Proxy struct {
	p     *toxiproxy.Proxy
	srv   *Server
	seq   atomic.Int64
	cutMu sync.Mutex
}

var proxySeq atomic.Int64

// Proxy starts a proxy and fails t if it cannot; it is stopped with the Server.
func (s *Server) Proxy(t testing.TB, cfg ProxyConfig) *Proxy {
	t.Helper()
	p, err := s.NewProxy(cfg)
	if err != nil {
		t.Fatalf("netproxy: %v", err)
	}
	return p
}

// NewProxy is Proxy for code without a test at hand (Config.Advertise of kafkabroker).
func (s *Server) NewProxy(cfg ProxyConfig) (*Proxy, error) {
	if cfg.Upstream == "" {
		return nil, errors.New("ProxyConfig.Upstream is required")
	}
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("proxy-%d", proxySeq.Add(1))
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Latency == 0 {
		cfg.Latency = DefaultLatency
	}
	tp := toxiproxy.NewProxy(s.api, cfg.Name, cfg.Listen, cfg.Upstream)
	if err := s.api.Collection.Add(tp, true); err != nil {
		return nil, fmt.Errorf("start proxy %s to %s: %w", cfg.Name, cfg.Upstream, err)
	}
	p := &Proxy{p: tp, srv: s}
	s.mu.Lock()
	s.all = append(s.all, p)
	s.mu.Unlock()
	if cfg.Latency > 0 {
		if _, err := p.Inject(Latency(cfg.Latency, 0).Named("baseline")); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Addr is the host:port the proxy listens on.
func (p *Proxy) Addr() string {
	p.p.Lock()
	defer p.p.Unlock()
	return p.p.Listen
}

// Upstream is the host:port the proxy forwards to.
func (p *Proxy) Upstream() string { return p.p.Upstream }

// RewriteURL returns the URL u (a PostgreSQL connection URL, postgres://…) with its host and
// port replaced by the proxy's, so that a client of it connects through the proxy.
func (p *Proxy) RewriteURL(u string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme == "" || parsed.Host == "" {
		// (Not quoted: a key=value DSN may hold a password.)
		return "", errors.New("netproxy: the connection string is not a URL with a host (a key=value DSN cannot be rewritten)")
	}
	parsed.Host = p.Addr()
	return parsed.String(), nil
}

// Cut closes every connection through the proxy now, both ways (a FIN to each side: the peers
// read an end of stream), and goes on accepting new ones: what a stateful firewall or a NAT
// gateway that forgot its connections does.
func (p *Proxy) Cut() error {
	p.cutMu.Lock()
	defer p.cutMu.Unlock()
	p.p.Stop()
	if err := p.p.Start(); err != nil {
		return fmt.Errorf("netproxy: restart proxy %s on %s after a cut: %w", p.p.Name, p.p.Listen, err)
	}
	return nil
}

// Direction is the way data flows through a proxy that a fault applies to.
type Direction int

const (
	// Both applies a fault to both ways.
	Both Direction = iota
	// Upstream is from the client to the server the proxy forwards to (queries, produce
	// requests, a replication stream's status updates).
	Upstream
	// Downstream is from the server to the client (results, responses, a replication
	// stream's data).
	Downstream
)

func (d Direction) streams() []string {
	switch d {
	case Upstream:
		return []string{"upstream"}
	case Downstream:
		return []string{"downstream"}
	}
	return []string{"upstream", "downstream"}
}

// Fault is a toxic of toxiproxy: its type, attributes and direction. Build it with Latency,
// ResetPeer, Blackhole, Bandwidth or LimitData, and inject it with Proxy.Inject.
type Fault struct {
	// Type is the toxic's type ("latency", "reset_peer", "timeout", "bandwidth",
	// "limit_data", …).
	Type string
	// Attributes are the toxic's attributes, as toxiproxy's API takes them.
	Attributes map[string]any
	// Direction is the way the fault applies to. Defaults to Both.
	Direction Direction
	// Name names the toxic in its proxy. Defaults to the type and a number.
	Name string
}

// Toward returns f applied to the direction d only.
func (f Fault) Toward(d Direction) Fault { f.Direction = d; return f }

// Named returns f with the toxic name name.
func (f Fault) Named(name string) Fault { f.Name = name; return f }

// Latency delays every chunk of data by d, give or take jitter.
func Latency(d, jitter time.Duration) Fault {
	return Fault{Type: "latency", Attributes: map[string]any{"latency": d.Milliseconds(), "jitter": jitter.Milliseconds()}}
}

// ResetPeer resets a connection (TCP RST: SO_LINGER 0) once data arrives on it, after the
// delay after; the data is lost. A connection opened before the fault was injected is closed
// rather than reset (toxiproxy sets SO_LINGER when a connection starts): its peers read an end
// of stream instead of ECONNRESET.
func ResetPeer(after time.Duration) Fault {
	return Fault{Type: "reset_peer", Attributes: map[string]any{"timeout": after.Milliseconds()}}
}

// Blackhole drops every byte and keeps the connections open: a peer that answers nothing, as a
// partitioned network or a host gone without a word. When the fault is removed, the
// connections it held are closed (their streams lost bytes); new ones work.
func Blackhole() Fault {
	return Fault{Type: "timeout", Attributes: map[string]any{"timeout": 0}}
}

// Bandwidth limits the throughput of every connection to kbPerSec KB/s.
func Bandwidth(kbPerSec int64) Fault {
	return Fault{Type: "bandwidth", Attributes: map[string]any{"rate": kbPerSec}}
}

// LimitData closes a connection once bytes more bytes went through it (counted from the fault's
// injection for the connections open then, from their start for later ones): 0 closes each at
// its next byte.
func LimitData(bytes int64) Fault {
	return Fault{Type: "limit_data", Attributes: map[string]any{"bytes": bytes}}
}

// Toxic is a fault injected into a proxy (or into several: Kafka.Inject).
type Toxic struct {
	p     *Proxy
	names []string
	subs  []*Toxic // the same fault in other proxies, removed with it
	once  sync.Once
	err   error
}

// Inject adds f to the proxy: from now on it applies to the connections open now and to every
// later one, until Toxic.Remove. It is safe to call from any goroutine (a hook of the component
// under test): Inject returns once every open connection carries the fault.
func (p *Proxy) Inject(f Fault) (*Toxic, error) {
	if f.Type == "" {
		return nil, errors.New("netproxy: Fault.Type is required")
	}
	name := f.Name
	if name == "" {
		name = fmt.Sprintf("%s-%d", f.Type, p.seq.Add(1))
	}
	x := &Toxic{p: p}
	for _, stream := range f.Direction.streams() {
		body, err := json.Marshal(map[string]any{"name": name + "-" + stream, "type": f.Type, "stream": stream,
			"toxicity": 1.0, "attributes": f.Attributes})
		if err != nil {
			return nil, fmt.Errorf("netproxy: %w", err)
		}
		if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
			_ = x.Remove()
			return nil, fmt.Errorf("netproxy: add %s %s to proxy %s: %w", f.Type, stream, p.p.Name, err)
		}
		x.names = append(x.names, name+"-"+stream)
	}
	return x, nil
}

// MustInject is Inject on the test's goroutine: it fails t if the fault cannot be added.
func (p *Proxy) MustInject(t testing.TB, f Fault) *Toxic {
	t.Helper()
	x, err := p.Inject(f)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// Remove takes the fault out of the proxy: data flows as before on the connections it left
// open. Calling it again does nothing.
func (x *Toxic) Remove() error {
	x.once.Do(func() {
		var errs []error
		for _, sub := range x.subs {
			errs = append(errs, sub.Remove())
		}
		for _, name := range x.names {
			if err := x.p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
				errs = append(errs, fmt.Errorf("netproxy: remove %s: %w", name, err))
			}
		}
		x.err = errors.Join(errs...)
	})
	return x.err
}

// LeakOptions are the goroutines toxiproxy leaves behind, for goleak (testenv.Main(m,
// netproxy.LeakOptions()...)): when a fault closes a connection (LimitData, ResetPeer,
// Blackhole's removal), the toxics before it in the connection's chain stay blocked on a send to
// it forever. They hold a chunk of the closed connection each and nothing else.
func LeakOptions() []goleak.Option {
	return []goleak.Option{goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run")}
}
