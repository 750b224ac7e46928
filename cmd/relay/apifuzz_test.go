package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/apifuzz"
	"github.com/keiro-go/keiro/outbox"
)

// TestAdminAPIFuzzed runs schemathesis against the running relay's admin API, with dead and
// rejected rows in its outbox (keirotest/testenv/apifuzz: no 5xx, only the statuses and JSON its OpenAPI
// document declares).
func TestAdminAPIFuzzed(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "orders", 1)
	ctx := context.Background()
	st, err := outbox.NewStore(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	// Rows that went dead and rejected before this relay started (set in the enqueuing
	// transaction, so no relay claims them).
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := st.EnqueueTx(ctx, tx,
			testEvent("f-1", "billing", "orders", k("a")), testEvent("f-2", "billing", "orders", nil)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE keiro_outbox SET status = 'dead', attempt_count = 3, last_error = 'broker unreachable' WHERE message_id = 'f-1';
UPDATE keiro_outbox SET status = 'rejected', attempt_count = 1, last_error = 'too big', rejection_code = 'message_too_large', rejected_at = now() WHERE message_id = 'f-2'`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, []string{
		"KEIRO_RELAY_DATABASE_URL=" + testenv.DatabaseURL(),
		"KEIRO_RELAY_SCHEMA=" + db.Schema,
		"KEIRO_RELAY_BROKERS=" + strings.Join(kc.Seeds, ","),
		"KEIRO_RELAY_HTTP_ADDR=127.0.0.1:0",
		"KEIRO_RELAY_ADMIN_TOKEN=fuzz-token",
	}, "--poll-interval=200ms")
	addr := p.waitLine(t, listening, 30*time.Second)[1]
	apifuzz.Run(t, "http://"+addr, "fuzz-token", p.output)
}
