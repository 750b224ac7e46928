package logmode_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/logmode"
)

// A publication that lost keiro_outbox_log (the table dropped and created again, here taken
// out of it) while the schema is in log mode means the events committed meanwhile were not
// decoded: the engine's next session refuses, with the line that says how to recover, and
// never confirms the slot past those events. Before, the session ran on the empty
// publication, published nothing, logged nothing and confirmed past them.
func TestSessionRefusesAPublicationThatLostItsTable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}})
	ctx := context.Background()
	name := f.db.Schema + "_keiro_log"
	stop := run(t, f.newEngine(t, f.cfg, logmode.Hooks{}))
	commitEvents(t, f.db.Pool, event{id: "before", dest: "orders", key: "k"})
	f.kafka.ConsumeRecords(t, 1, time.Minute, "orders")
	stop()

	_, err := f.db.Pool.Exec(ctx, "ALTER PUBLICATION "+name+" DROP TABLE keiro_outbox_log")
	require.NoError(t, err)
	commitEvents(t, f.db.Pool, event{id: "lost", dest: "orders", key: "k"})
	after := walLSN(t, f)

	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = f.newEngine(t, f.cfg, logmode.Hooks{}).Run(rctx)
	require.Error(t, err, "the session refuses the publication")
	require.ErrorContains(t, err, "publishes no table")
	require.ErrorContains(t, err, "relay mode prepare")
	require.ErrorContains(t, err, "relay mode recover --since=")
	require.Less(t, slotConfirmedLSN(t, f), after, "the slot is not confirmed past the event it did not decode")
}
