package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv/internal/jaeger"
)

// TraceBackendEnv names the environment variable that points the tests at a running Jaeger v2
// instead of the one the kit starts: its OTLP/HTTP receiver and its query service, as
// "otlp=http://host:4318,query=http://host:16686".
const TraceBackendEnv = "KEIRO_TEST_TRACE_BACKEND"

// TraceBackendVersion is the Jaeger release (github.com/jaegertracing/jaeger, its cmd/jaeger)
// the kit builds and starts.
const TraceBackendVersion = jaeger.Version

// Span is one span read back from the trace backend.
type Span = jaeger.Span

// SpanLink is one link of a Span.
type SpanLink = jaeger.Link

// TraceBackend is a real OpenTelemetry trace backend (Jaeger v2 with in-memory storage) shared by
// the tests of the process: the processes under test export to it over OTLP, and a test reads
// each trace back, as an operator would see it.
type TraceBackend struct {
	// OTLPEndpoint is the OTLP/HTTP receiver's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT with
	// OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (the default).
	OTLPEndpoint string
	// OTLPGRPCEndpoint is the OTLP/gRPC receiver's URL, for OTEL_EXPORTER_OTLP_PROTOCOL=grpc
	// (empty when the backend comes from KEIRO_TEST_TRACE_BACKEND).
	OTLPGRPCEndpoint string
	// QueryURL is the query service's base URL.
	QueryURL string

	j *jaeger.Jaeger
}

// sharedTraces is the process's trace backend.
var sharedTraces struct {
	once sync.Once
	tb   *TraceBackend
	err  error
}

// NewTraceBackend returns the process's trace backend: the one named by KEIRO_TEST_TRACE_BACKEND,
// else a Jaeger v2 the kit starts once per test process (under a second; the first start on a
// machine builds it from the Go module proxy, which takes minutes). It fails the test, never
// skips it, when the backend cannot be started. Trace ids are unique, so tests share it freely.
func NewTraceBackend(t testing.TB) *TraceBackend {
	t.Helper()
	sharedTraces.once.Do(func() {
		if env := strings.TrimSpace(os.Getenv(TraceBackendEnv)); env != "" {
			sharedTraces.tb, sharedTraces.err = parseTraceBackend(env)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		j, err := jaeger.Start(ctx, jaeger.Config{})
		if err != nil {
			sharedTraces.err = fmt.Errorf("start the trace backend (or set %s): %w", TraceBackendEnv, err)
			return
		}
		sharedTraces.tb = &TraceBackend{OTLPEndpoint: j.OTLPHTTP, OTLPGRPCEndpoint: j.OTLPGRPC, QueryURL: j.QueryURL, j: j}
	})
	if sharedTraces.err != nil {
		t.Fatalf("keirotest: %v", sharedTraces.err)
	}
	return sharedTraces.tb
}

func parseTraceBackend(env string) (*TraceBackend, error) {
	tb := &TraceBackend{}
	for _, part := range strings.Split(env, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		switch {
		case ok && k == "otlp":
			tb.OTLPEndpoint = strings.TrimRight(v, "/")
		case ok && k == "query":
			tb.QueryURL = strings.TrimRight(v, "/")
		default:
			return nil, fmt.Errorf("%s: %q is not otlp=URL or query=URL", TraceBackendEnv, part)
		}
	}
	if tb.OTLPEndpoint == "" || tb.QueryURL == "" {
		return nil, fmt.Errorf("%s: want otlp=URL,query=URL, got %q", TraceBackendEnv, env)
	}
	tb.j = &jaeger.Jaeger{OTLPHTTP: tb.OTLPEndpoint, QueryURL: tb.QueryURL}
	return tb, nil
}

// WaitTrace reads trace traceID (32 hex digits) back until done accepts its spans, and returns
// them; it fails the test with the spans last seen when timeout passes first. Exporters send
// spans in batches, so a test waits for the spans it expects rather than for a fixed time.
func (b *TraceBackend) WaitTrace(t testing.TB, traceID string, timeout time.Duration, done func([]Span) bool) []Span {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var spans []Span
	var err error
	for {
		spans, err = b.j.Trace(ctx, traceID)
		switch {
		case err == nil && done(spans):
			return spans
		case err != nil && !errors.Is(err, jaeger.ErrTraceNotFound) && ctx.Err() == nil:
			t.Fatalf("keirotest: %v", err)
		}
		select {
		case <-ctx.Done():
			var names []string
			for _, s := range spans {
				names = append(names, s.Service+": "+s.Name)
			}
			t.Fatalf("keirotest: trace %s incomplete after %s (last error: %v); spans seen: %q", traceID, timeout, err, names)
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// StopTraceBackend stops the trace backend the kit started for this process, if any; later
// trace tests of the process fail. Run calls it.
func StopTraceBackend() {
	sharedTraces.once.Do(func() { sharedTraces.err = errors.New("the trace backend was stopped") })
	if sharedTraces.tb != nil && sharedTraces.tb.j != nil {
		sharedTraces.tb.j.Close()
	}
}
