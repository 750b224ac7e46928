package inbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/netproxy"
)

func TestMain(m *testing.M) { testenv.Main(m, netproxy.LeakOptions()...) }

var seq atomic.Int64

// newEvent returns a valid JSON event with a unique message id.
func newEvent(source, topic string) envelope.Event {
	n := seq.Add(1)
	key := fmt.Sprintf("k%d", n%7)
	id := envelope.NewUUIDv7()
	pos := n
	return envelope.Event{
		MessageID:            fmt.Sprintf("msg-%d-%s", n, id),
		Source:               source,
		Destination:          topic,
		Key:                  &key,
		EventType:            "OrderPlaced",
		SchemaVersion:        1,
		ContentType:          envelope.ContentTypeJSON,
		SourceEventID:        &id,
		SourceGlobalPosition: &pos,
		Payload:              []byte(fmt.Sprintf(`{"n":%d}`, n)),
		OccurredAt:           time.Now().UTC().Truncate(time.Microsecond),
		TraceContext:         &envelope.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "k=v"},
		Attributes:           []byte(`{"tenant":"t1"}`),
	}
}

// effects is a side table a test handler writes to, one row per effect.
type effects struct {
	db    *testenv.DB
	table string
}

func newEffects(t testing.TB, db *testenv.DB) *effects {
	t.Helper()
	e := &effects{db: db, table: db.Schema + ".effects"}
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+e.table+` (
		seq bigint GENERATED ALWAYS AS IDENTITY, message_id text NOT NULL, msg_key text, payload text)`)
	require.NoError(t, err)
	return e
}

// handler records the event as an effect.
func (e *effects) handler() inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		var k *string
		if ev.Key != nil {
			k = ev.Key
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+e.table+` (message_id, msg_key, payload) VALUES ($1, $2, $3)`,
			ev.MessageID, k, string(ev.Payload))
		return err
	}
}

func (e *effects) count(t testing.TB, messageID string) int {
	t.Helper()
	var n int
	q := `SELECT count(*) FROM ` + e.table
	args := []any{}
	if messageID != "" {
		q += ` WHERE message_id = $1`
		args = append(args, messageID)
	}
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

func newStore(t testing.TB, db *testenv.DB, mod ...func(*inbox.StoreConfig)) *inbox.Store {
	t.Helper()
	cfg := inbox.StoreConfig{Schema: db.Schema, Consumer: "billing", MaxAttempts: 3}
	for _, m := range mod {
		m(&cfg)
	}
	s, err := inbox.NewStore(cfg)
	require.NoError(t, err)
	return s
}
