// Package gctune sets the Go garbage collector of the relay and consumer binaries for a
// sidecar: a little more heap for less CPU, bounded by the container's memory limit.
//
// The consumer's hot path allocates in proportion to the records it moves (fetched batches,
// decoded envelopes, the parameters of each inbox insert); at Go's default GOGC=100 the
// collector took about a fifth of its CPU in the consumer benchmarks. GOGC=200 cut the
// process's CPU per message by 10–25 % there (docs/benchmarks-history.md). The soft memory limit keeps the
// larger heap target inside the container: as the heap nears 90 % of the cgroup's memory limit
// the collector runs as often as it must, whatever GOGC says.
//
// Both are defaults: a GOGC or GOMEMLIMIT environment variable is left alone, as the Go runtime
// documents them.
package gctune

import (
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// DefaultGOGC is the GOGC the binaries run with when the environment sets none.
const DefaultGOGC = 200

// memoryLimitShare is the share of the container's memory limit given to the Go runtime as its
// soft memory limit; the rest covers what the runtime does not count (thread stacks, cgo).
const memoryLimitShare = 0.9

// Settings are the collector settings in effect, and where each came from.
type Settings struct {
	// GOGC is the garbage collection target percentage (-1: off).
	GOGC int
	// GOGCSource is "environment" or "default".
	GOGCSource string
	// MemoryLimit is the soft memory limit in bytes (math.MaxInt64: none).
	MemoryLimit int64
	// MemoryLimitSource is "environment", "cgroup" or "none".
	MemoryLimitSource string
}

// Apply sets GOGC and the soft memory limit unless the environment sets them, and returns the
// settings in effect. Call it once, first thing in main.
func Apply() Settings {
	return apply(os.Getenv, "/sys/fs/cgroup")
}

func apply(getenv func(string) string, cgroupRoot string) Settings {
	var s Settings
	if getenv("GOGC") == "" {
		debug.SetGCPercent(DefaultGOGC)
		s.GOGCSource = "default"
	} else {
		s.GOGCSource = "environment"
	}
	s.GOGC = debug.SetGCPercent(-1)
	debug.SetGCPercent(s.GOGC)

	switch limit, ok := cgroupMemoryLimit(cgroupRoot); {
	case getenv("GOMEMLIMIT") != "":
		s.MemoryLimitSource = "environment"
	case ok:
		debug.SetMemoryLimit(int64(float64(limit) * memoryLimitShare))
		s.MemoryLimitSource = "cgroup"
	default:
		s.MemoryLimitSource = "none"
	}
	s.MemoryLimit = debug.SetMemoryLimit(-1)
	return s
}

// cgroupMemoryLimit reads the memory limit of the process's cgroup: cgroup v2's memory.max,
// else cgroup v1's memory/memory.limit_in_bytes. ok is false without a limit ("max", or v1's
// page-rounded maximum) or when neither file can be read.
func cgroupMemoryLimit(root string) (limit int64, ok bool) {
	for _, f := range []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0, false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0, false // v1 reports "no limit" as a huge page-rounded number
		}
		return n, true
	}
	return 0, false
}

// Current returns the GOGC and soft memory limit in effect (the sources are left empty), for
// the binaries' start-up log line.
func Current() Settings {
	gogc := debug.SetGCPercent(-1)
	debug.SetGCPercent(gogc)
	return Settings{GOGC: gogc, MemoryLimit: debug.SetMemoryLimit(-1)}
}

// LogValue renders the settings for a log line: the memory limit in MiB, "none" without one.
func (s Settings) LogValue() slog.Value {
	limit := "none"
	if s.MemoryLimit != math.MaxInt64 {
		limit = strconv.FormatInt(s.MemoryLimit>>20, 10) + "MiB"
	}
	return slog.GroupValue(slog.Int("gogc", s.GOGC), slog.String("memory_limit", limit))
}
