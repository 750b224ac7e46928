// Package healthcheck is the "relay healthcheck" and "consumer healthcheck" command: it GETs the
// binary's own /readyz (or /healthz) and exits 0 when the answer is 200 and 1 otherwise, so a
// container image without curl or a shell can still run Docker and compose healthchecks.
//
// The command reads the same --http-addr flag and environment variable as the binary's run
// command, so a container configured with KEIRO_RELAY_HTTP_ADDR=0.0.0.0:9464 checks itself on
// 127.0.0.1:9464 without further settings. It needs no database or Kafka configuration.
package healthcheck
