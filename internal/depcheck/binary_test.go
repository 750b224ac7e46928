package depcheck

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxBinaryOverhead bounds the binary of examples/minimal-service against its floor, the same
// service written against pgx and franz-go directly (testdata/floor): what keiro adds — its own
// code, the OpenTelemetry API, log/slog and kadm's lag query — stays within this fraction of
// what the dependencies cost anyway. docs/benchmarks-history.md, "Dependencies and binary
// size", records both sizes. 12 %: log mode's control code in package outbox (the mode switch,
// its slots per destination set, their overlap check and recovery; about 20 KB) is linked by
// every relay, since Run reaches it; the log-mode engine itself stays behind outbox/logrelay.
// The service measured 1.110× its floor with it (2026-12-02). 13 %: exactly-once publication
// (RelayConfig.ExactlyOnce, a run-time switch every relay's Run reaches: the claim engine's
// transactions and recovery in package outbox, package exactlyonce, and franz-go's
// transactional producer) added 223 KB, 1.128× (2026-12-06).
const maxBinaryOverhead = 0.13

// reflectMethods are the functions that make the linker keep every exported method of every
// reachable type (dead method elimination is off once any of them is reachable): text/template
// and html/template call them, and so would any reflection on methods by name.
var reflectMethods = []string{
	"reflect.Value.Method",
	"reflect.Value.MethodByName",
	"reflect.(*rtype).Method",
	"reflect.(*rtype).MethodByName",
}

// build builds the main package pkg into dir with the linker's dependency dump, returning the
// binary's size and, for each reachable symbol, the symbol that first reached it.
func build(t *testing.T, dir, pkg string) (int64, map[string]string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command(goBin, "build", "-ldflags=-dumpdep", "-o", bin, pkg)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, stderr.String())
	}
	reachedBy := map[string]string{}
	sc := bufio.NewScanner(&stderr)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		from, to, ok := strings.Cut(sc.Text(), " -> ")
		if !ok {
			continue
		}
		if i := strings.Index(from, " <"); i >= 0 { // " <UsedInIface>", " <ReflectMethod>"
			from = from[:i]
		}
		if _, seen := reachedBy[to]; !seen {
			reachedBy[to] = from
		}
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size(), reachedBy
}

// chain is the path by which the linker reached sym, from sym back to the entry point.
func chain(reachedBy map[string]string, sym string) string {
	path := []string{sym}
	for s := sym; len(path) < 30; {
		from, ok := reachedBy[s]
		if !ok {
			break
		}
		path, s = append(path, from), from
	}
	return strings.Join(path, "\n    <- ")
}

// firstTemplateSymbol returns the text/template or html/template symbol the linker reached
// by the shortest path, or "" when it reached none.
func firstTemplateSymbol(reachedBy map[string]string) string {
	best, bestLen := "", 0
	for sym := range reachedBy {
		if !strings.HasPrefix(sym, "text/template.") && !strings.HasPrefix(sym, "html/template.") {
			continue
		}
		n := strings.Count(chain(reachedBy, sym), "<-")
		if best == "" || n < bestLen || n == bestLen && sym < best {
			best, bestLen = sym, n
		}
	}
	return best
}

// TestMinimalServiceBinary builds examples/minimal-service and its floor with the same flags
// (go build with the linker's dependency dump, which changes only the build settings recorded
// in the binary) and checks that the service keeps the linker's dead method elimination
// (no reflection on methods by name, no text/template or html/template) and that its binary
// stays within maxBinaryOverhead of the floor.
func TestMinimalServiceBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	size, reachedBy := build(t, dir, "./examples/minimal-service")
	floor, _ := build(t, dir, "./internal/depcheck/testdata/floor")

	for _, sym := range reflectMethods {
		if _, ok := reachedBy[sym]; ok {
			t.Errorf("examples/minimal-service reaches %s, which turns off the linker's dead method elimination and keeps every exported method in the binary; it is reached by:\n    %s",
				sym, chain(reachedBy, sym))
			break
		}
	}
	if sym := firstTemplateSymbol(reachedBy); sym != "" {
		t.Errorf("examples/minimal-service links %s (templates reflect on methods by name); it is reached by:\n    %s",
			sym, chain(reachedBy, sym))
	}
	if limit := int64(float64(floor) * (1 + maxBinaryOverhead)); size > limit {
		t.Errorf("examples/minimal-service is %d B, more than %.0f %% over its floor (testdata/floor, the same service on pgx and franz-go alone: %d B, limit %d B): see what grew with go tool nm -size -sort size",
			size, maxBinaryOverhead*100, floor, limit)
	}
	t.Logf("examples/minimal-service %d B, floor %d B (%.3f×)", size, floor, float64(size)/float64(floor))
}
