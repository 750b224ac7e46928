// Package jaeger runs Jaeger v2 on loopback for tests: a real OpenTelemetry trace backend that
// accepts OTLP over HTTP and gRPC, keeps spans in memory, and answers its query API, so that a
// test reads back the spans our processes exported, with their parents, links and attributes.
// The binary is built from the Go module proxy once per machine (Build) and runs as a child
// process that dies with the process that started it.
package jaeger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keiro-go/keiro/internal/proc"
)

// Version is the release of github.com/jaegertracing/jaeger whose cmd/jaeger (Jaeger v2) is built.
const Version = "1.75.0"

// DefaultStartTimeout bounds the wait for Jaeger to answer after it was started.
const DefaultStartTimeout = time.Minute

// Config configures Start.
type Config struct {
	// Binary is the Jaeger executable. Defaults to Build's.
	Binary string
	// Dir holds the configuration and the log (<Dir>/jaeger.log). Defaults to a new temporary
	// directory, removed by Close.
	Dir string
	// StartTimeout bounds the wait for Jaeger to answer. Defaults to DefaultStartTimeout.
	StartTimeout time.Duration
}

// Jaeger is a running Jaeger v2 on loopback with in-memory storage.
type Jaeger struct {
	// OTLPHTTP is the OTLP/HTTP receiver's base URL (http://127.0.0.1:<port>), what
	// OTEL_EXPORTER_OTLP_ENDPOINT is set to with the http/protobuf protocol.
	OTLPHTTP string
	// OTLPGRPC is the OTLP/gRPC receiver's URL (http://127.0.0.1:<port>), for the grpc protocol.
	OTLPGRPC string
	// QueryURL is the query service's base URL (/api/services, /api/v3/traces/{id}).
	QueryURL string

	dir     proc.RunDir
	p       *proc.Process
	closing sync.Once
}

// config is Jaeger's collector configuration: OTLP receivers, in-memory storage, the query
// service; every listener on loopback, its own telemetry off (no fixed ports).
const config = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:%[3]d
    grpc:
      endpoint: 127.0.0.1:%[4]d
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%[1]d
      grpc:
        endpoint: 127.0.0.1:%[2]d
processors:
  batch:
    timeout: 50ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// Start builds Jaeger if needed (Build), starts it on free loopback ports and waits until both
// the OTLP receiver and the query service answer. Close stops it.
func Start(ctx context.Context, cfg Config) (*Jaeger, error) {
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.Binary == "" {
		bin, err := Build(ctx)
		if err != nil {
			return nil, fmt.Errorf("jaeger: %w", err)
		}
		cfg.Binary = bin
	}
	dir, err := proc.NewRunDir(cfg.Dir, "keiro-jaeger-")
	if err != nil {
		return nil, fmt.Errorf("jaeger: %w", err)
	}
	j := &Jaeger{dir: dir}
	ok := false
	defer func() {
		if !ok {
			j.Close()
		}
	}()
	ports, err := proc.FreePorts(4)
	if err != nil {
		return nil, fmt.Errorf("jaeger: %w", err)
	}
	conf := filepath.Join(j.dir.Path, "config.yaml")
	if err := os.WriteFile(conf, fmt.Appendf(nil, config, ports[0], ports[1], ports[2], ports[3]), 0o644); err != nil {
		return nil, fmt.Errorf("jaeger: write the configuration: %w", err)
	}
	j.OTLPHTTP = "http://" + addr(ports[0])
	j.OTLPGRPC = "http://" + addr(ports[1])
	j.QueryURL = "http://" + addr(ports[2])
	if j.p, err = proc.Start(j.LogPath(), j.dir.Path, cfg.Binary, []string{"--config", "file:" + conf}); err != nil {
		return nil, fmt.Errorf("jaeger: start %s: %w", cfg.Binary, err)
	}
	if err := j.waitReady(ctx, ports[0], cfg.StartTimeout); err != nil {
		return nil, err
	}
	ok = true
	return j, nil
}

// waitReady waits until the query service lists services and the OTLP/HTTP receiver accepts
// connections.
func (j *Jaeger) waitReady(ctx context.Context, otlpPort int, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	err := j.p.WaitReady(ctx, "Jaeger", timeout, 50*time.Millisecond, func() string { return j.logTail(40) },
		func(ctx context.Context) error {
			if err := get(ctx, client, j.QueryURL+"/api/services", nil); err != nil {
				return err
			}
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr(otlpPort))
			if err != nil {
				return err
			}
			return c.Close()
		})
	if err != nil {
		return fmt.Errorf("jaeger: %w", err)
	}
	return nil
}

// ErrTraceNotFound is returned by Trace when Jaeger holds no span of the trace (yet).
var ErrTraceNotFound = errors.New("jaeger: trace not found")

// Trace returns the spans Jaeger holds of the trace with the given id (32 hex digits), or
// ErrTraceNotFound. Spans arrive in batches: a caller waits for the ones it expects.
func (j *Jaeger) Trace(ctx context.Context, traceID string) ([]Span, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	var doc json.RawMessage
	err := get(ctx, client, j.QueryURL+"/api/v3/traces/"+traceID, &doc)
	var se statusError
	if errors.As(err, &se) && se.code == http.StatusNotFound {
		return nil, ErrTraceNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("jaeger: read trace %s: %w", traceID, err)
	}
	spans, err := DecodeTrace(doc)
	if err != nil {
		return nil, fmt.Errorf("jaeger: read trace %s: %w", traceID, err)
	}
	return spans, nil
}

// statusError is a non-200 answer.
type statusError struct {
	code int
	body string
}

func (e statusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.code, e.body) }

// get sends GET url and decodes a 200 answer's JSON body into out (when not nil).
func get(ctx context.Context, client *http.Client, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return statusError{code: resp.StatusCode, body: strings.TrimSpace(string(body))}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("decode %s: %w", url, err)
	}
	return nil
}

// LogPath is the file Jaeger writes its output to.
func (j *Jaeger) LogPath() string { return filepath.Join(j.dir.Path, "jaeger.log") }

func (j *Jaeger) logTail(lines int) string { return proc.TailFile(j.LogPath(), lines) }

// Close kills Jaeger, waits for it to exit and removes the run directory when Start made it.
// Safe to call more than once.
func (j *Jaeger) Close() {
	j.closing.Do(func() {
		j.p.Kill(time.Minute)
		j.dir.Remove("KEIRO_JAEGER_KEEP")
	})
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
