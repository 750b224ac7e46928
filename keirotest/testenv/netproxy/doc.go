// Package netproxy puts a real network between the parts of a test: TCP proxies on loopback
// (toxiproxy's server, run in the test process from its Go packages) through which a relay or a
// consumer reaches PostgreSQL and the Kafka brokers, and faults a test adds to them and removes
// while traffic flows — latency, connection resets, a blackhole, a bandwidth cut, a cut after a
// number of bytes.
//
// Every proxy starts with DefaultLatency each way, a cross-zone network, so that the tests run
// on round trips that cost something rather than on loopback's microseconds.
//
//	srv := netproxy.New(t)
//	pg := srv.Proxy(t, netproxy.ProxyConfig{Name: "pg", Upstream: "127.0.0.1:5432"})
//	url, _ := pg.RewriteURL(testenv.DatabaseURL()) // connect through pg
//	cut, _ := pg.Inject(netproxy.ResetPeer(0).Toward(netproxy.Downstream))
//	// ... the next reply on every connection is lost ...
//	_ = cut.Remove()
//
// Faults are timed on events, not on sleeps: a test adds a fault from a hook of the component
// under test (a claim starts, a record is acknowledged) and removes it on the next event
// (a new session, a renewal), and LimitData cuts a connection after a number of bytes.
package netproxy
