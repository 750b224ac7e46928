package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// With --log-format=json every stderr line is JSON, the fatal error included.
func TestJSONLogsToTheLastLine(t *testing.T) {
	// Nothing listens on port 1: the relay logs its start, then fails to reach the database.
	r := invoke(t, "--log-format=json", "--database-url=postgres://u:pw@127.0.0.1:1/db?connect_timeout=5", "--brokers=127.0.0.1:1")
	if r.code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if len(lines) < 2 {
		t.Fatalf("want the start line and the error, got:\n%s", r.stderr)
	}
	var last map[string]any
	for _, l := range lines {
		last = nil
		if err := json.Unmarshal([]byte(l), &last); err != nil {
			t.Fatalf("not JSON: %q\n%s", l, r.stderr)
		}
	}
	if last["level"] != "ERROR" || !strings.Contains(last["msg"].(string), "127.0.0.1") || strings.Contains(r.stderr, "pw@") {
		t.Fatalf("last line: %v", last)
	}

	// Configuration problems too.
	r = invoke(t, "--log-format=json", "--database-url=postgres://h/db", "--brokers=h:1", "--batch-size=0")
	if r.code != 2 {
		t.Fatalf("exit code %d, want 2:\n%s", r.code, r.stderr)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stderr)), &m); err != nil || m["msg"] != "--batch-size: must be at least 1, got 0" {
		t.Fatalf("config error report: %q (%v)", r.stderr, err)
	}
}
