package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestRowsListAndStuck: `relay rows list` filters and pages in seq order; `relay rows stuck`
// shows the rows claimed longer ago than --older-than; both print JSON lines with --json.
func TestRowsListAndStuck(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ids := seed(t, db,
		testEvent("r1", "ordering", "orders", k("o1")),
		testEvent("r2", "ordering", "orders", k("o2")),
		testEvent("r3", "billing", "invoices", nil),
	)
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'publishing', attempt_count = 1,
		lease_until = now() + interval '1 minute', updated_at = now() - interval '1 hour' WHERE message_id = 'r2'`, db.Schema))
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"--database-url=" + testenv.DatabaseURL(), "--schema=" + db.Schema}
	run := func(args ...string) result { return invoke(t, append(base, args...)...) }

	r := run("rows", "list")
	if r.code != 0 || !strings.Contains(r.stdout, ids["r1"]) || !strings.Contains(r.stdout, ids["r3"]) {
		t.Fatalf("rows list: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = run("rows", "list", "--destination=orders", "--json", "--limit=1")
	var row listedRow
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &row); err != nil || row.OutboxID != ids["r1"] ||
		!strings.Contains(r.stderr, fmt.Sprintf("--after=%d", row.Seq)) {
		t.Fatalf("rows list page 1: %v\n%s\n%s", err, r.stdout, r.stderr)
	}
	r = run("rows", "list", "--destination=orders", "--json", fmt.Sprintf("--after=%d", row.Seq))
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &row); err != nil || row.OutboxID != ids["r2"] || row.Status != "publishing" {
		t.Fatalf("rows list page 2: %v\n%s", err, r.stdout)
	}
	if r = run("rows", "list", "--status=lost"); r.code == 0 {
		t.Fatalf("rows list --status=lost: %d", r.code)
	}

	r = run("rows", "stuck", "--json")
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &row); err != nil || row.OutboxID != ids["r2"] || row.Attempts != 1 {
		t.Fatalf("rows stuck: %v\n%s\n%s", err, r.stdout, r.stderr)
	}
	if r = run("rows", "stuck", "--older-than=2h"); r.code != 0 || strings.Contains(r.stdout, ids["r2"]) {
		t.Fatalf("rows stuck --older-than=2h: %d\n%s", r.code, r.stdout)
	}
}
