package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// BenchmarkBinaryStartStop measures the relay binary's time from exec to "relay running" (schema
// checked, pool and client built, HTTP bound) and from SIGTERM to exit when idle, next to its
// limit, --shutdown-timeout. Run: go test ./cmd/relay -run XXX -bench BinaryStartStop -benchtime 20x
func BenchmarkBinaryStartStop(b *testing.B) {
	db := testenv.NewDB(b)
	kc := testenv.NewKafka(b)
	const shutdownTimeout = 10 * time.Second
	relayBinary(b)
	var startup, stop time.Duration
	for b.Loop() {
		began := time.Now()
		p := start(b, nil, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "--brokers="+kc.Seeds[0],
			"--http-addr=127.0.0.1:0", "--shutdown-timeout="+shutdownTimeout.String())
		p.waitLine(b, regexpMust(`relay running`), 30*time.Second)
		startup += time.Since(began)
		began = time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			b.Fatal(err)
		}
		<-p.done
		stop += time.Since(began)
		if p.err != nil {
			b.Fatalf("exit: %v", p.err)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(startup.Milliseconds())/n, "ms-to-running")
	b.ReportMetric(float64(stop.Microseconds())/1000/n, "ms-to-exit")
	b.ReportMetric(float64(shutdownTimeout.Milliseconds()), "ms-shutdown-limit")
}
