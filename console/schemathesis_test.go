package console_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/console"
)

// schemathesisVersion is the version .ci/run installs.
const schemathesisVersion = "4.32.5"

// TestSchemathesis fuzzes the admin API from its own OpenAPI document with schemathesis: a
// console serving the outbox, an inbox with a handler, a dead-letter topic and the event
// store, over PostgreSQL and a Kafka cluster, with dead rows, a poisoned message and a dead
// letter in them. Every generated request, valid or not, must be answered without a 5xx, with
// the status codes and the JSON the document declares. The run is bounded (examples per
// operation and a time budget) and deterministic (a fixed seed). schemathesis must be installed
// (.ci/run installs it); KEIRO_SCHEMATHESIS_EXAMPLES changes the examples per operation.
func TestSchemathesis(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("schemathesis")
	require.NoError(t, err, "schemathesis is not installed: python3 -m pip install schemathesis==%s (as .ci/run does)", schemathesisVersion)

	const topic, dlq, token = "orders.fz.v1", "orders.fz.v1.dlq", "fuzz-token"
	var logs bytes.Buffer
	r := newRig(t, func(c *console.Config) {
		c.Inbox.DeadLetterTopics = []string{dlq}
		c.Auth = console.AuthConfig{Token: token}
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError}))
	})
	ids := r.enqueue(t, event("f1", "payments.v1", ptr("k1"), `{"a":1}`), event("f2", "payments.v1", nil, "text"))
	r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'dead', attempt_count = 2, last_error = 'boom 1' WHERE outbox_id = $1`, r.db.Schema), ids[0])
	r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'rejected', rejected_at = now(), rejection_code = 'message_too_large', last_error = 'big' WHERE outbox_id = $1`, r.db.Schema), ids[1])
	r.process(t, event("p-1", topic, ptr("k"), `{"poison":true}`), 0, 3)
	r.kc.CreateTopic(t, dlq, 1)
	dl := record(event("d-1", topic, ptr("k"), `{}`), dlq)
	dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: "keiro-dlq-reason", Value: []byte("decode")},
		kgo.RecordHeader{Key: "keiro-dlq-topic", Value: []byte(topic)})
	require.NoError(t, r.kc.NewClient(t).ProduceSync(context.Background(), dl).FirstErr())

	examples := 10
	if s := os.Getenv("KEIRO_SCHEMATHESIS_EXAMPLES"); s != "" {
		examples, err = strconv.Atoi(s)
		require.NoError(t, err, "KEIRO_SCHEMATHESIS_EXAMPLES")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run", r.srv.URL+"/api/v1/openapi.json", "--url", r.srv.URL,
		"--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
		"--header", "Authorization: Bearer "+token,
		"--phases", "examples,coverage,fuzzing", "--max-examples", strconv.Itoa(examples),
		"--seed", "26", "--no-shrink", "--workers", "1", "--request-timeout", "10",
		"--no-color", "--report-dir", t.TempDir())
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "SCHEMATHESIS_TELEMETRY=false", "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "schemathesis found problems:\n%s\nconsole errors:\n%s", out, logs.String())
	t.Logf("schemathesis:\n%s", lastLines(string(out), 15))
}

// lastLines is the end of s.
func lastLines(s string, n int) string {
	lines := bytes.Split([]byte(s), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
