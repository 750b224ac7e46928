// Command jaeger builds and runs the trace backend of keiro-go's test suite (Jaeger v2, built from
// the Go module proxy).
//
//	go run ./keirotest/testenv/internal/jaeger/cmd/jaeger build   # build once per machine (minutes cold)
//	go run ./keirotest/testenv/internal/jaeger/cmd/jaeger run
//
// build compiles github.com/jaegertracing/jaeger/cmd/jaeger at the pinned release into the
// per-machine cache. run starts it on loopback, prints KEIRO_TEST_TRACE_BACKEND=… for the tests
// to use and the UI's address, and stops it on SIGINT or SIGTERM.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv/internal/jaeger"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "jaeger:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: jaeger build | run")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "build":
		start := time.Now()
		bin, err := jaeger.Build(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("Jaeger %s: %s (%s)\n", jaeger.Version, bin, time.Since(start).Round(time.Millisecond))
		return nil
	case "run":
		j, err := jaeger.Start(ctx, jaeger.Config{})
		if err != nil {
			return err
		}
		defer j.Close()
		fmt.Printf("KEIRO_TEST_TRACE_BACKEND=otlp=%s,query=%s\n", j.OTLPHTTP, j.QueryURL)
		fmt.Printf("UI and query API: %s (OTLP/gRPC: %s); Ctrl-C stops it\n", j.QueryURL, j.OTLPGRPC)
		<-ctx.Done()
		return nil
	default:
		return fmt.Errorf("unknown command %q (want build or run)", args[0])
	}
}
