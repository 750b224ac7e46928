package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// unreachableEnv is a run configuration whose database and brokers do not answer (port 1).
func unreachableEnv() []string {
	return []string{
		"KEIRO_CONSUMER_DATABASE_URL=postgres://u:pw@127.0.0.1:1/db?connect_timeout=5",
		"KEIRO_CONSUMER_BROKERS=127.0.0.1:1", "KEIRO_CONSUMER_GROUP=g", "KEIRO_CONSUMER_TOPICS=t",
		"KEIRO_CONSUMER_HANDLER=sql", "KEIRO_CONSUMER_SQL_FUNCTION=f", "KEIRO_CONSUMER_HTTP_ADDR=",
	}
}

// With --log-format=json every stderr line is JSON, the fatal error included.
func TestJSONLogsToTheLastLine(t *testing.T) {
	t.Parallel()
	r := runBinary(t, 60*time.Second, unreachableEnv(), "--log-format=json")
	if r.code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", r.code, r.stderr)
	}
	var last map[string]any
	for _, l := range strings.Split(strings.TrimRight(r.stderr, "\n"), "\n") {
		last = nil
		if err := json.Unmarshal([]byte(l), &last); err != nil {
			t.Fatalf("not JSON: %q\n%s", l, r.stderr)
		}
	}
	if last["level"] != "ERROR" || !strings.Contains(last["msg"].(string), "connect to PostgreSQL") || strings.Contains(r.stderr, "pw@") {
		t.Fatalf("last line: %v", last)
	}
}

// A bad OTEL_* value is a configuration error: exit 2, as in the relay.
func TestBadOTELVariableExitsTwo(t *testing.T) {
	t.Parallel()
	r := runBinary(t, 60*time.Second, append(unreachableEnv(), "OTEL_TRACES_EXPORTER=carrier-pigeon"))
	if r.code != 2 || !strings.Contains(r.stderr, "OTEL_TRACES_EXPORTER") {
		t.Fatalf("exit code %d, want 2 naming the variable:\n%s", r.code, r.stderr)
	}
}

// --version prints the build and exits 0, before any configuration is checked.
func TestVersionFlag(t *testing.T) {
	t.Parallel()
	r := runBinary(t, 30*time.Second, nil, "--version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "consumer ") || !strings.Contains(r.stdout, "(commit ") {
		t.Fatalf("--version: %d %q %q", r.code, r.stdout, r.stderr)
	}
}
