package kafkaconfig_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/cmd/internal/kafkaconfig"
)

// A client that cannot reach its broker logs the failure through slog at warn or error.
func TestLoggerReportsConnectionFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kafkaconfig.Logger(log))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := cl.Ping(ctx); err == nil {
		t.Fatal("ping of a closed port succeeded")
	}
	cl.Close()
	out := buf.String()
	if !strings.Contains(out, "component=kafka") || !(strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR")) {
		t.Fatalf("no kafka warning logged:\n%s", out)
	}
	if strings.Contains(out, "level=DEBUG") || strings.Contains(out, "level=INFO") {
		t.Fatalf("below-warn messages logged at warn level:\n%s", out)
	}
}
