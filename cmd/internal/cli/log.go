package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// Defaults of [LogFlags].
const (
	DefaultLogLevel  = "info"
	DefaultLogFormat = "text"
)

// LogFlags are the logging flags every binary shares; embed them in the root grammar struct.
type LogFlags struct {
	// LogLevel is the minimum level logged: debug, info, warn or error. Defaults to
	// [DefaultLogLevel].
	LogLevel string `help:"Minimum level logged: debug, info, warn or error." default:"info" placeholder:"LEVEL"`
	// LogFormat is text (logfmt-like) or json. Defaults to [DefaultLogFormat].
	LogFormat string `help:"Log format: text or json." default:"text" placeholder:"FORMAT"`
}

// ValidateFlags reports an unknown level or format.
func (f *LogFlags) ValidateFlags() error {
	var p Problems
	if _, err := parseLevel(f.LogLevel); err != nil {
		p.AddErr("log-level", err)
	}
	switch f.LogFormat {
	case "text", "json":
	default:
		p.Add("log-format", "unknown format %q: use text or json", f.LogFormat)
	}
	return p.Err()
}

// Logger returns a structured logger writing to w in the configured format and level. A line
// logged with a context that carries an OpenTelemetry span (log.InfoContext(ctx, …)) gets the
// span's trace_id and span_id attributes.
func (f *LogFlags) Logger(w io.Writer) (*slog.Logger, error) {
	lvl, err := parseLevel(f.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	o := &slog.HandlerOptions{Level: lvl}
	switch f.LogFormat {
	case "json":
		return slog.New(TraceHandler(slog.NewJSONHandler(w, o))), nil
	case "text", "":
		return slog.New(TraceHandler(slog.NewTextHandler(w, o))), nil
	}
	return nil, fmt.Errorf("build logger: unknown format %q: use text or json", f.LogFormat)
}

// JSONLogs reports whether logs, and so the final error report of a command, are JSON.
func (f *LogFlags) JSONLogs() bool { return f.LogFormat == "json" }

// TraceHandler wraps h so that every record logged with a context holding a valid
// OpenTelemetry span context gets trace_id and span_id attributes (W3C hex), the names log
// pipelines use to join logs with traces.
func TraceHandler(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ slog.Handler }

// Handle adds the span's ids to r.
func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs keeps the wrapper around the derived handler.
func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

// WithGroup keeps the wrapper around the derived handler.
func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown level %q: use debug, info, warn or error", s)
}
