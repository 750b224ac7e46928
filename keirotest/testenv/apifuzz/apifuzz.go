// Package apifuzz runs schemathesis against a keiro admin API (/api/v1, described by its own
// GET /api/v1/openapi.json), for the tests of the console and of the binaries that serve it.
// The run is bounded (examples per operation) and reproducible (a fixed seed): every
// generated request, valid or not, must be answered without a 5xx, with a status code and a
// JSON body the document declares. schemathesis must be installed (.ci/run installs Version);
// its absence fails the test.
package apifuzz

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Version is the schemathesis version .ci/run installs.
const Version = "4.32.5"

// DefaultExamples is the examples per operation when KEIRO_SCHEMATHESIS_EXAMPLES is not set.
const DefaultExamples = 10

// Run fuzzes the API served at base (scheme://host:port) with the bearer token (required: the
// API's POSTs need it, or a CSRF token schemathesis cannot fetch). diagnose, when set, is
// called for the failure message (the server's log, for example).
func Run(t testing.TB, base, token string, diagnose func() string) {
	t.Helper()
	bin, err := exec.LookPath("schemathesis")
	if err != nil {
		t.Fatalf("schemathesis is not installed: python3 -m pip install schemathesis==%s (as .ci/run does)", Version)
	}
	examples := DefaultExamples
	if s := os.Getenv("KEIRO_SCHEMATHESIS_EXAMPLES"); s != "" {
		if examples, err = strconv.Atoi(s); err != nil || examples < 1 {
			t.Fatalf("KEIRO_SCHEMATHESIS_EXAMPLES=%q is not a positive whole number", s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run", base+"/api/v1/openapi.json", "--url", base,
		"--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
		"--header", "Authorization: Bearer "+token,
		"--phases", "examples,coverage,fuzzing", "--max-examples", strconv.Itoa(examples),
		"--seed", "26", "--no-shrink", "--workers", "1", "--request-timeout", "10",
		"--no-color", "--report-dir", t.TempDir())
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "SCHEMATHESIS_TELEMETRY=false", "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		extra := ""
		if diagnose != nil {
			extra = "\nserver:\n" + diagnose()
		}
		t.Fatalf("schemathesis found problems (%v):\n%s%s", err, out, extra)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("schemathesis: %s", strings.Join(lines[max(0, len(lines)-6):], "\n"))
}
