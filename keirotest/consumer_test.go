package keirotest_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest"
)

// newInvoices returns a test database with the invoices table applyInvoice writes.
func newInvoices(t *testing.T) *keirotest.DB {
	t.Helper()
	db := keirotest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(),
		`CREATE TABLE invoices (order_id text PRIMARY KEY, total_cents int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// flaky fails every time for order 1003 (poisoned after MaxAttempts) and applies the others.
func flaky(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
	if ev.Key != nil && *ev.Key == "1003" {
		return errors.New("the ledger is locked for order 1003")
	}
	return applyInvoice(ctx, tx, ev)
}

// TestRunConsumerPoisonMessage: a real consumer processes a good record and dead-letters a
// permanently refused one and one that fails every attempt, each with its reason.
func TestRunConsumerPoisonMessage(t *testing.T) {
	t.Parallel()
	keirotest.EachKafka(t, keirotest.KafkaConfig{}, func(t *testing.T, kafka *keirotest.Kafka) {
		db := newInvoices(t)
		topic := kafka.Topic("ordering.orders.v1")
		c := keirotest.RunConsumer(t, db.Pool, kafka, flaky, inbox.ConsumerConfig{
			Topics: []string{topic}, Store: inbox.StoreConfig{MaxAttempts: 2},
		})
		events := []envelope.Event{orderEvent(t, "1001", "ada", 3000), orderEvent(t, "1002", "grace", -5),
			orderEvent(t, "1003", "alan", 100)}
		for i := range events {
			events[i].Destination = topic
			keirotest.Produce(t, kafka, events[i])
		}

		row := c.WaitProcessed(t, "placed-1001")
		if row.Status != keirotest.InboxCompleted || row.Entry.Delivery.Event.MessageID != "placed-1001" {
			t.Fatalf("want the completed inbox row of placed-1001, got %+v", row)
		}
		if d := c.WaitDeadLettered(t, "placed-1002"); d.Reason != inbox.ReasonPermanent || string(d.Record.Key) != "1002" {
			t.Fatalf("want placed-1002 dead-lettered as permanent, got reason %q key %q", d.Reason, d.Record.Key)
		}
		if d := c.WaitDeadLettered(t, "placed-1003"); d.Reason != inbox.ReasonPoisoned {
			t.Fatalf("want placed-1003 dead-lettered as poisoned, got %q", d.Reason)
		}
		dlq := topic + ".dlq"
		got := keirotest.RequireDeadLettered(t, kafka, dlq, keirotest.DeadLettered{
			MessageID: "placed-1002", Reason: inbox.ReasonPermanent, Error: "negative total", SourceTopic: topic,
			Consumer: keirotest.DefaultConsumer, Count: 1,
		})
		if d := got[0]; d.DecodeErr != nil || d.Event.EventType != "OrderPlaced" || d.SourceOffset != 1 || d.At.IsZero() {
			t.Fatalf("want the original record of placed-1002 with its dead-letter headers decoded, got %+v", d)
		}
		keirotest.RequireDeadLettered(t, kafka, dlq, keirotest.DeadLettered{MessageID: "placed-1003",
			Reason: inbox.ReasonPoisoned, Attempts: 2, Error: "ledger is locked"})
		keirotest.RequireDeadLettered(t, kafka, dlq, keirotest.DeadLettered{Count: 2})
		if n := invoices(t, db); n != 1 {
			t.Fatalf("want the one invoice of order 1001, got %d", n)
		}
		if dl := c.DeadLetters(); len(dl) != 2 {
			t.Fatalf("want 2 dead letters reported, got %+v", dl)
		}
		if err := c.Stop(t); err != nil {
			t.Fatalf("want a clean stop, got %v", err)
		}
	})
}

// TestProduceWritesTheRelaysHeaders: a record of Produce carries the headers the relay writes
// for the same event, in the same order.
func TestProduceWritesTheRelaysHeaders(t *testing.T) {
	t.Parallel()
	db := keirotest.NewDB(t)
	kafka := keirotest.NewKafka(t, "ordering.orders.v1", "copy.orders.v1")
	ev := orderEvent(t, "1001", "ada", 3000)
	corr := envelope.NewUUIDv7()
	ev.CorrelationID = &corr
	ev.Attributes = []byte(`{"tenant":"eu"}`)
	enqueue(t, db, ev)
	keirotest.DrainOutbox(t, db.Pool, kafka)
	relayed := kafka.Records(t, "ordering.orders.v1")[0]

	produced := keirotest.Produce(t, kafka, ev)
	if produced.Topic != "ordering.orders.v1" || produced.Offset != 1 || string(produced.Key) != "1001" ||
		string(produced.Value) != string(relayed.Value) {
		t.Fatalf("want the event's record at offset 1, got topic %q offset %d key %q", produced.Topic, produced.Offset, produced.Key)
	}
	if !slices.EqualFunc(relayed.Headers, produced.Headers, func(a, b kgo.RecordHeader) bool {
		return a.Key == b.Key && string(a.Value) == string(b.Value)
	}) {
		t.Fatalf("the headers differ from the relay's:\n relay:   %s\n Produce: %s", headerList(relayed.Headers),
			headerList(produced.Headers))
	}
}

func headerList(hs []kgo.RecordHeader) string {
	s := ""
	for _, h := range hs {
		s += h.Key + "=" + string(h.Value) + " "
	}
	return s
}

func TestRunConsumerFailures(t *testing.T) {
	t.Parallel()
	db := newInvoices(t)
	kafka := keirotest.NewKafka(t, "ordering.orders.v1")
	c := keirotest.RunConsumer(t, db.Pool, kafka, applyInvoice, inbox.ConsumerConfig{Topics: []string{"ordering.orders.v1"}},
		keirotest.ConsumerOptions{Timeout: 300e6})
	refused := orderEvent(t, "1002", "grace", -5)
	keirotest.Produce(t, kafka, refused)
	c.WaitDeadLettered(t, refused.MessageID)

	t.Run("WaitProcessed of a dead-lettered message fails at once", func(t *testing.T) {
		r := record(t, func(tb testing.TB) { c.WaitProcessed(tb, refused.MessageID) })
		requireFailure(t, r, `keirotest.Consumer.WaitProcessed: message "placed-1002" was not processed: its inbox row is [dead_lettered]`,
			`consumer "keirotest" (group "keirotest", schema "`+db.Schema+`")`, "dead-lettered 1, ",
			`it dead-lettered 1 record:`, `reason "permanent"`)
	})
	t.Run("WaitDeadLettered of a processed message fails at once", func(t *testing.T) {
		good := orderEvent(t, "1001", "ada", 3000)
		keirotest.Produce(t, kafka, good)
		c.WaitProcessed(t, good.MessageID)
		r := record(t, func(tb testing.TB) { c.WaitDeadLettered(tb, good.MessageID) })
		requireFailure(t, r, `message "placed-1001" was processed, not dead-lettered: its inbox row is [completed]`)
	})
	t.Run("a wait times out with what the consumer did", func(t *testing.T) {
		r := record(t, func(tb testing.TB) { c.WaitProcessed(tb, "never-sent") })
		requireFailure(t, r, `timed out after 300ms waiting for message "never-sent" to be processed`,
			`its inbox holds 2 rows:`, `[completed] message id "placed-1001"`)
	})
	t.Run("RequireDeadLettered lists the dead letters", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireDeadLettered(tb, kafka, "ordering.orders.v1.dlq", keirotest.DeadLettered{Reason: inbox.ReasonPoisoned})
		})
		requireFailure(t, r, `keirotest.RequireDeadLettered: no dead letter matches on topic "ordering.orders.v1.dlq"`,
			`want: reason "poisoned"`, `found 1 record on topic "ordering.orders.v1.dlq":`,
			`1. partition 0 offset 0: reason "permanent" after 1 attempt, from ordering.orders.v1 partition 0 offset 0 by consumer "keirotest"`,
			`error: permanent: order 1002 has a negative total`, `differs: reason is "permanent", want "poisoned"`)
	})
	t.Run("unknown reason", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireDeadLettered(tb, kafka, "ordering.orders.v1.dlq", keirotest.DeadLettered{Reason: "poison"})
		})
		requireFailure(t, r, `unknown DeadLettered.Reason "poison": use inbox.ReasonDecode`)
	})
	t.Run("an empty dead-letter topic says so", func(t *testing.T) {
		r := record(t, func(tb testing.TB) {
			keirotest.RequireDeadLettered(tb, kafka, "billing.dlq", keirotest.DeadLettered{})
		})
		requireFailure(t, r, `topic "billing.dlq" has no records (is it the consumer's dead-letter topic?`)
	})
	t.Run("bad configuration", func(t *testing.T) {
		r := record(t, func(tb testing.TB) { keirotest.RunConsumer(tb, db.Pool, kafka, applyInvoice, inbox.ConsumerConfig{}) })
		requireFailure(t, r, "keirotest.RunConsumer: inbox.ConsumerConfig.Topics is empty")
		r = record(t, func(tb testing.TB) {
			keirotest.RunConsumer(tb, db.Pool, kafka, nil, inbox.ConsumerConfig{Topics: []string{"x"}})
		})
		requireFailure(t, r, "keirotest.RunConsumer: inbox consumer config: handler: required")
	})
	t.Run("Produce refuses an invalid event", func(t *testing.T) {
		r := record(t, func(tb testing.TB) { keirotest.Produce(tb, kafka, envelope.Event{MessageID: "m"}) })
		requireFailure(t, r, "keirotest.Produce: the event is not valid, so the relay would never publish it")
	})
}
