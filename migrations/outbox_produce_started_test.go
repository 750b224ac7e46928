package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

// TestOutboxProduceStartedMigration: the migration that records a last attempt's produce start
// in a column of its own, applied to an outbox holding rows in flight, keeps what the earlier
// release recorded in the claim token (its version digit 8): a row whose lease expired on its
// last attempt after its produce started goes dead at the next claim, one whose produce never
// started is claimed for that attempt again, without counting another, and published.
func TestOutboxProduceStartedMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true})
	schema := db.Schema
	conn := connect(t)
	if err := migrations.MigrateBefore(ctx, conn, schema, "_outbox_produce_started.sql"); err != nil {
		t.Fatalf("migrate to the release before: %v", err)
	}
	for _, row := range []struct{ id, key string }{{"started", "A"}, {"unstarted", "B"}, {"pending", "C"}} {
		if _, err := conn.Exec(ctx, `INSERT INTO `+schema+`.keiro_outbox (outbox_id, message_id, source,
            destination, message_key, event_type, schema_version, content_type, payload_bytes, occurred_at)
            VALUES (gen_random_uuid(), $1, 's', 'orders', $2, 'E', 1, 'application/json', '\x00', now())`,
			row.id, row.key); err != nil {
			t.Fatalf("insert %s: %v", row.id, err)
		}
	}
	// Both in flight on their last attempt (3 of 3) under an expired lease: one under the
	// earlier release's started token, one under a plain token.
	if _, err := conn.Exec(ctx, `UPDATE `+schema+`.keiro_outbox SET status = 'publishing', attempt_count = 3,
        claim_token = CASE message_id WHEN 'started' THEN overlay(gen_random_uuid()::text placing '8' from 15 for 1)::uuid
                                      ELSE gen_random_uuid() END,
        lease_until = now() - interval '1 second', last_error = 'broker timeout'
        WHERE message_id IN ('started', 'unstarted')`); err != nil {
		t.Fatal(err)
	}

	for range 2 { // the second run is a no-op
		if err := migrations.Migrate(ctx, conn, schema); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	started := func() map[string]bool {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT message_id, produce_started FROM `+schema+`.keiro_outbox`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]bool{}
		for rows.Next() {
			var id string
			var s bool
			if err := rows.Scan(&id, &s); err != nil {
				t.Fatal(err)
			}
			out[id] = s
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := started(); !got["started"] || got["unstarted"] || got["pending"] || len(got) != 3 {
		t.Fatalf("produce_started after the migration = %v, want only the row under a started token", got)
	}

	// A relay of this release settles the three rows.
	kc := testenv.NewKafka(t, "orders")
	var settled testenv.Progress
	r, err := outbox.NewRelay(db.Pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{
		Schema: schema, MaxAttempts: 3, PollInterval: 10 * time.Millisecond,
		OnBatch: func(b outbox.BatchResult) { settled.Add(int64(b.Published + b.Dead)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	settled.Wait(t, 3, 30*time.Second, done)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("relay: %v", err)
	}

	type row struct {
		status, lastError string
		attempts          int
	}
	want := map[string]row{
		"started":   {"dead", "lease expired after final attempt (last error: broker timeout)", 3},
		"unstarted": {"sent", "", 3},
		"pending":   {"sent", "", 1},
	}
	for id, w := range want {
		var got row
		if err := conn.QueryRow(ctx, `SELECT status, coalesce(last_error, ''), attempt_count FROM `+schema+`.keiro_outbox
            WHERE message_id = $1`, id).Scan(&got.status, &got.lastError, &got.attempts); err != nil {
			t.Fatal(err)
		}
		if got != w {
			t.Errorf("row %s = %+v, want %+v", id, got, w)
		}
	}
	if got := started(); got["started"] || got["unstarted"] || got["pending"] {
		t.Fatalf("produce_started after the rows settled = %v, want none", got)
	}
}
