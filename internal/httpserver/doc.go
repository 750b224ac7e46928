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
// ends: in-flight requests finish within Config.ShutdownTimeout.
package httpserver
