package netproxy_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/netproxy"
)

func TestMain(m *testing.M) { testenv.Main(m, netproxy.LeakOptions()...) }

// echo starts a TCP server that writes back what it reads, until the test ends; each
// connection's bytes go to received once it ends.
func echo(t *testing.T) (addr string, received <-chan string) {
	t.Helper()
	got := make(chan string, 16)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var all []byte
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					all = append(all, buf[:n]...)
					if n > 0 {
						_, _ = c.Write(buf[:n])
					}
					if err != nil {
						got <- string(all)
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String(), got
}

// setup is one test's proxy in front of an echo server.
func setup(t *testing.T) *netproxy.Proxy {
	t.Helper()
	p, _ := setupEcho(t)
	return p
}

// setupEcho is setup with the echo server's received connections.
func setupEcho(t *testing.T) (*netproxy.Proxy, <-chan string) {
	t.Helper()
	addr, received := echo(t)
	return netproxy.New(t).Proxy(t, netproxy.ProxyConfig{Upstream: addr}), received
}

func dial(t *testing.T, p *netproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads as many bytes back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	buf := make([]byte, len(msg))
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, msg, string(buf))
}

// TestProxyForwardsWithItsBaselineLatency: bytes go through the proxy both ways, and the
// baseline latency is a toxic of the proxy like any other.
func TestProxyForwardsWithItsBaselineLatency(t *testing.T) {
	t.Parallel()
	p := setup(t)
	roundTrip(t, dial(t, p), "hello through the proxy")
	_, err := p.Inject(netproxy.Latency(netproxy.DefaultLatency, 0).Named("baseline"))
	require.Error(t, err, "the baseline latency is already there under its name")
}

// TestLimitDataCutsAfterTheBytes: with a 4-byte limit upstream, the server gets the first 4
// bytes of a 10-byte write and the connection is closed after them.
func TestLimitDataCutsAfterTheBytes(t *testing.T) {
	t.Parallel()
	p, received := setupEcho(t)
	c := dial(t, p)
	roundTrip(t, c, "warm")
	x := p.MustInject(t, netproxy.LimitData(4).Toward(netproxy.Upstream))
	_, err := c.Write([]byte("0123456789"))
	require.NoError(t, err)
	require.Equal(t, "warm0123", <-received, "the server got the bytes up to the limit, then an end of stream")
	got, _ := io.ReadAll(c)
	require.True(t, strings.HasPrefix("0123", string(got)), "the client's connection ends too, after at most the echo of those bytes: %q", got)
	require.NoError(t, x.Remove())
	require.NoError(t, x.Remove(), "a second Remove does nothing")
	roundTrip(t, dial(t, p), "a new connection passes once the fault is removed")
}

// TestBlackholeDropsAndClosesOnRemoval: a blackholed connection delivers nothing; removing the
// fault closes it (its stream lost bytes), and new connections work.
func TestBlackholeDropsAndClosesOnRemoval(t *testing.T) {
	t.Parallel()
	p := setup(t)
	c := dial(t, p)
	roundTrip(t, c, "before")
	x := p.MustInject(t, netproxy.Blackhole())
	_, err := c.Write([]byte("lost"))
	require.NoError(t, err)
	read := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(c)
		read <- b
	}()
	require.NoError(t, x.Remove())
	require.Empty(t, <-read, "nothing came back through the blackhole")
	roundTrip(t, dial(t, p), "after")
}

// TestResetPeerResetsNewConnections: a connection opened after a reset_peer fault is reset
// (ECONNRESET) at its first bytes.
func TestResetPeerResetsNewConnections(t *testing.T) {
	t.Parallel()
	p := setup(t)
	x := p.MustInject(t, netproxy.ResetPeer(0))
	c := dial(t, p)
	_, err := c.Write([]byte("reset me"))
	require.NoError(t, err)
	_, err = io.ReadAll(c)
	require.True(t, errors.Is(err, syscall.ECONNRESET), "want ECONNRESET, got %v", err)
	require.NoError(t, x.Remove())
	roundTrip(t, dial(t, p), "after")
}

// TestCutClosesOpenConnectionsAndKeepsListening: Cut ends the connections open now; the proxy
// accepts new ones on the same address.
func TestCutClosesOpenConnectionsAndKeepsListening(t *testing.T) {
	t.Parallel()
	p := setup(t)
	addr := p.Addr()
	c := dial(t, p)
	roundTrip(t, c, "before")
	require.NoError(t, p.Cut())
	got, _ := io.ReadAll(c)
	require.Empty(t, got)
	require.Equal(t, addr, p.Addr())
	roundTrip(t, dial(t, p), "after")
}

// TestRewriteURL: a PostgreSQL URL is pointed at the proxy, everything else kept; a key=value
// DSN is refused without echoing its password.
func TestRewriteURL(t *testing.T) {
	t.Parallel()
	p := setup(t)
	got, err := p.RewriteURL("postgres://u:secret@db.example:5432/app?sslmode=disable&search_path=s1")
	require.NoError(t, err)
	require.Equal(t, "postgres://u:secret@"+p.Addr()+"/app?sslmode=disable&search_path=s1", got)
	_, err = p.RewriteURL("host=db password=secret")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret")
}
