// Package httpserver is the operational HTTP endpoint of keiro's binaries:
//
//   - GET /healthz: 200 "ok" while the process serves HTTP (liveness; it checks nothing else,
//     so a slow database never gets the process killed);
//   - GET /readyz: runs every named [Check] concurrently, each under Config.CheckTimeout, and
//     answers 200 with a JSON body when all pass, 503 naming each failing check otherwise, and
//     503 "draining" once [Server.SetDraining] was called (so a load balancer stops routing
//     before shutdown);
//   - GET /metrics: the given handler (the Prometheus exporter of otelsetup.Setup); 404 if none.
//
// The server binds when [Listen] returns (so a taken port fails at startup and [Server.Addr]
// knows the port chosen for ":0"), listens on loopback by default ([DefaultAddr]) because the
// endpoints are unauthenticated, and [Server.Serve] shuts it down gracefully when its context
// ends: in-flight requests finish within Config.ShutdownTimeout. Every connection is bounded:
// reading a request's headers (5 s) and the whole request (30 s), answering it (1 minute; the
// admin API's and console's actions, POSTs, 5 minutes), idling between requests (1 minute),
// headers (64 KiB, 431 beyond) and bodies (1 MiB, 413 beyond); Config overrides each.
package httpserver
