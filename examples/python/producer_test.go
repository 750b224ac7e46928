package python_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest"
)

// debianPython is Debian's interpreter, which sees the python3-psycopg2 package (a pyenv
// python3 earlier on PATH does not).
const debianPython = "/usr/bin/python3"

// TestPythonProducer runs producer.py against a test schema: every order is inserted through
// <schema>.enqueue, the retry is a duplicate with the first order's outbox id, the changed copy
// a conflict naming the payload, and the rows are valid envelopes in the producer's order per
// key. Without psycopg2 the test skips locally and fails under CI (CI installs
// python3-psycopg2).
func TestPythonProducer(t *testing.T) {
	t.Parallel()
	if err := exec.Command(debianPython, "-c", "import psycopg2").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s cannot import psycopg2 (%v); install the Debian package python3-psycopg2", debianPython, err)
		}
		t.Skipf("%s cannot import psycopg2; apt-get install python3-psycopg2", debianPython)
	}
	db := keirotest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 12
	cmd := exec.CommandContext(ctx, debianPython, "producer.py")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+keirotest.DatabaseURL(), "KEIRO_SCHEMA="+db.Schema,
		"N=12", "RUN_ID=test", "TOPIC=orders")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("producer.py: %v\n%s", err, stderr.String())
	}
	type line struct {
		MessageID string `json:"message_id"`
		OutboxID  string `json:"outbox_id"`
		Outcome   string `json:"outcome"`
		Detail    string `json:"detail"`
	}
	var lines []line
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("producer.py printed %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if len(lines) != n+2 {
		t.Fatalf("producer.py printed %d lines, want %d:\n%s", len(lines), n+2, out)
	}
	for _, l := range lines[:n] {
		if l.Outcome != "inserted" {
			t.Fatalf("order %s: outcome %q, want inserted", l.MessageID, l.Outcome)
		}
	}
	if l := lines[n]; l.Outcome != "duplicate" || l.MessageID != "order-test-0" || l.OutboxID != lines[0].OutboxID {
		t.Fatalf("retry: %+v, want a duplicate of %+v", l, lines[0])
	}
	if l := lines[n+1]; l.Outcome != "conflict" || l.Detail != "conflicting fields: payload" {
		t.Fatalf("changed copy: %+v, want a conflict on the payload", l)
	}

	rows, err := db.Pool.Query(ctx, `SELECT message_id, source, destination, message_key, event_type,
        schema_version, content_type, payload_bytes, attributes, occurred_at, seq
        FROM keiro_outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got int
	lastOrder := map[string]int{}
	for rows.Next() {
		var e envelope.Event
		var seq int64
		if err := rows.Scan(&e.MessageID, &e.Source, &e.Destination, &e.Key, &e.EventType, &e.SchemaVersion,
			&e.ContentType, &e.Payload, &e.Attributes, &e.OccurredAt, &seq); err != nil {
			t.Fatal(err)
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("row %s is not a valid envelope: %v", e.MessageID, err)
		}
		var p struct{ OrderID, Customer string }
		if err := json.Unmarshal(e.Payload, &p); err != nil || p.OrderID != e.MessageID || e.Key == nil || p.Customer != *e.Key {
			t.Fatalf("row %s: payload %s, key %v (err %v)", e.MessageID, e.Payload, e.Key, err)
		}
		var i int
		if _, err := fmt.Sscanf(e.MessageID, "order-test-%d", &i); err != nil {
			t.Fatalf("row %s: unexpected message id", e.MessageID)
		}
		if prev, ok := lastOrder[*e.Key]; ok && prev > i {
			t.Fatalf("key %s: order %d has a larger seq than order %d, written after it", *e.Key, prev, i)
		}
		lastOrder[*e.Key] = i
		got++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("%d outbox rows, want %d", got, n)
	}
}
