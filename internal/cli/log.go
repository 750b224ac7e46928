package cli

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
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

// Logger returns a structured logger writing to w in the configured format and level.
func (f *LogFlags) Logger(w io.Writer) (*slog.Logger, error) {
	lvl, err := parseLevel(f.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	o := &slog.HandlerOptions{Level: lvl}
	switch f.LogFormat {
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, o)), nil
	}
	return nil, fmt.Errorf("build logger: unknown format %q: use text or json", f.LogFormat)
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
