package gctune

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// restore puts the collector back as the test found it.
func restore(t *testing.T) {
	gogc := debug.SetGCPercent(-1)
	debug.SetGCPercent(gogc)
	limit := debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		debug.SetGCPercent(gogc)
		debug.SetMemoryLimit(limit)
	})
}

func cgroup(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	return root
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestApplyDefaultsWithACgroupV2Limit(t *testing.T) {
	restore(t)
	debug.SetMemoryLimit(math.MaxInt64)
	s := apply(env(nil), cgroup(t, map[string]string{"memory.max": "268435456\n"}))
	require.Equal(t, Settings{GOGC: DefaultGOGC, GOGCSource: "default",
		MemoryLimit: 268435456 * 9 / 10, MemoryLimitSource: "cgroup"}, s)
	require.Equal(t, DefaultGOGC, debug.SetGCPercent(DefaultGOGC))
}

func TestApplyReadsCgroupV1(t *testing.T) {
	restore(t)
	s := apply(env(nil), cgroup(t, map[string]string{"memory/memory.limit_in_bytes": "1073741824"}))
	require.Equal(t, "cgroup", s.MemoryLimitSource)
	require.EqualValues(t, 1073741824*9/10, s.MemoryLimit)
}

func TestApplyWithoutALimit(t *testing.T) {
	restore(t)
	debug.SetMemoryLimit(math.MaxInt64)
	for name, files := range map[string]map[string]string{
		"v2 max":      {"memory.max": "max\n"},
		"v1 no limit": {"memory/memory.limit_in_bytes": "9223372036854771712\n"},
		"no cgroup":   nil,
		"garbage":     {"memory.max": "lots"},
	} {
		s := apply(env(nil), cgroup(t, files))
		require.Equal(t, "none", s.MemoryLimitSource, name)
		require.EqualValues(t, int64(math.MaxInt64), s.MemoryLimit, name)
	}
}

// GOGC and GOMEMLIMIT set in the environment are the runtime's to apply: left alone.
func TestApplyLeavesTheEnvironmentsSettings(t *testing.T) {
	restore(t)
	debug.SetGCPercent(75)
	debug.SetMemoryLimit(1 << 30)
	s := apply(env(map[string]string{"GOGC": "75", "GOMEMLIMIT": "1GiB"}),
		cgroup(t, map[string]string{"memory.max": "268435456"}))
	require.Equal(t, Settings{GOGC: 75, GOGCSource: "environment", MemoryLimit: 1 << 30,
		MemoryLimitSource: "environment"}, s)
}

func TestSettingsLogValue(t *testing.T) {
	require.Equal(t, "[gogc=200 memory_limit=230MiB]",
		Settings{GOGC: 200, MemoryLimit: 230 << 20}.LogValue().String())
	require.Equal(t, "[gogc=100 memory_limit=none]",
		Settings{GOGC: 100, MemoryLimit: math.MaxInt64}.LogValue().String())
}
