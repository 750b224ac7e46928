package netproxy_test

import (
	"fmt"
	"io"
	"net"

	"github.com/keiro-go/keiro/keirotest/testenv/netproxy"
)

// A proxy in front of a server, a fault injected while a connection is open, and the fault
// removed: the connection's reply is lost, the next connection works.
func Example() {
	server, _ := net.Listen("tcp", "127.0.0.1:0")
	defer server.Close()
	go func() { // a server that answers "pong" to each connection's first bytes
		for {
			c, err := server.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4)
			_, _ = io.ReadFull(c, buf)
			_, _ = c.Write([]byte("pong"))
			_ = c.Close()
		}
	}()

	srv := netproxy.NewServer() // in a test: netproxy.New(t), closed when the test ends
	defer srv.Close()
	p, err := srv.NewProxy(netproxy.ProxyConfig{Upstream: server.Addr().String()}) // 1ms each way
	if err != nil {
		panic(err)
	}

	ping := func() string {
		c, _ := net.Dial("tcp", p.Addr())
		defer c.Close()
		_, _ = c.Write([]byte("ping"))
		b, _ := io.ReadAll(c)
		return fmt.Sprintf("%q", b)
	}
	fmt.Println("before:", ping())
	lost, err := p.Inject(netproxy.LimitData(0).Toward(netproxy.Downstream)) // the reply is cut
	if err != nil {
		panic(err)
	}
	fmt.Println("during:", ping())
	_ = lost.Remove()
	fmt.Println("after:", ping())
	// Output:
	// before: "pong"
	// during: ""
	// after: "pong"
}
