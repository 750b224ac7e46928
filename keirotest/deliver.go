package keirotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/inbox/handlers"
)

// DefaultConsumer is the inbox consumer name Deliver uses.
const DefaultConsumer = "keirotest"

// DeliverConfig says how Deliver hands an event over. Exactly one of Handler, SQLFunction and
// HTTPURL must be set.
type DeliverConfig struct {
	// Handler is a Go inbox handler. Defaults to none.
	Handler inbox.Handler
	// SQLFunction is a PostgreSQL function called in the inbox transaction with the event's
	// JSON document (the consumer's sql mode, handlers.SQLConfig.Function). Defaults to none.
	SQLFunction string
	// HTTPURL is an endpoint the event's JSON document is POSTed to (the consumer's http
	// mode), typically an httptest.Server's URL. Defaults to none.
	HTTPURL string
	// HTTPClient sends the HTTP mode's requests; pass an httptest.Server's Client() for a TLS
	// server. Defaults to the http mode's own client.
	HTTPClient *http.Client
	// HTTPHeader holds extra request headers of the HTTP mode. Defaults to none.
	HTTPHeader http.Header
	// Twice delivers the event a second time after the first delivery, as Kafka does after a
	// consumer restart, and fails t unless the first was processed and the second suppressed
	// as a duplicate (the handler not run again). Defaults to false.
	Twice bool
	// Want fails t unless the first delivery's outcome is this: set it to the failure a test
	// expects (inbox.HandlerFailed, inbox.Poisoned, ...). Defaults to 0: the delivery must
	// succeed (inbox.Processed, or inbox.Duplicate for a message the inbox already holds), and
	// any failure fails t with the handler's error.
	Want inbox.Outcome
	// Schema is the schema of the inbox. Defaults to the schema of the keiro_outbox table on
	// the pool's search_path (a NewDB pool's schema), else "keiro".
	Schema string
	// Consumer is the inbox consumer name. Defaults to DefaultConsumer.
	Consumer string
	// DedupePolicy is the inbox's dedupe policy. Defaults to inbox.DedupeMessageID.
	DedupePolicy inbox.DedupePolicy
	// MaxAttempts is the inbox's failed-attempt ceiling. Defaults to inbox.DefaultMaxAttempts.
	MaxAttempts int
	// Kafka is where the event was read from, for handlers and dedupe policies that use it.
	// Defaults to nil.
	Kafka *inbox.KafkaRef
}

// Delivered is what Deliver did.
type Delivered struct {
	// Result is the first delivery's result (its Outcome, Attempts and the handler's Err).
	inbox.Result
	// Redelivery is the second delivery's result when DeliverConfig.Twice is set, else nil.
	Redelivery *inbox.Result
}

// Deliver hands ev to the handler cfg names through a real inbox transaction on pool
// (inbox.Store.Process), as the consumer does for a record read from Kafka, and returns the
// outcome. The handler's writes commit with the inbox row, or not at all. pool is a pool
// (a NewDB pool) or a transaction (a NewTx one), in which the inbox transaction is a nested
// one that the test's rollback undoes. It fails t on a storage error, on an invalid event, when
// the outcome differs from cfg.Want, and, with cfg.Twice, unless the redelivery was
// suppressed.
func Deliver(t testing.TB, pool keiro.DB, ev envelope.Event, cfg DeliverConfig) Delivered {
	t.Helper()
	const who = "keirotest.Deliver"
	if p, ok := pool.(*pgxpool.Pool); pool == nil || ok && p == nil {
		t.Fatalf("%s: pool is nil; pass the pool of keirotest.NewDB, your own, or a keirotest.NewTx", who)
	}
	modes := 0
	for _, set := range []bool{cfg.Handler != nil, cfg.SQLFunction != "", cfg.HTTPURL != ""} {
		if set {
			modes++
		}
	}
	if modes != 1 {
		t.Fatalf("%s: set exactly one of DeliverConfig.Handler, SQLFunction and HTTPURL (got %d)", who, modes)
	}
	if err := ev.Validate(); err != nil {
		t.Fatalf("%s: the event is not valid, so the consumer would never deliver it: %v", who, err)
	}
	if cfg.Want != 0 && strings.HasPrefix(cfg.Want.String(), "Outcome(") {
		t.Fatalf("%s: unknown DeliverConfig.Want %s: use an inbox outcome (inbox.Processed, inbox.HandlerFailed, "+
			"inbox.Poisoned, ...), or leave it 0 for a delivery that must succeed", who, cfg.Want)
	}
	if cfg.Consumer == "" {
		cfg.Consumer = DefaultConsumer
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema, err := resolveSchema(ctx, pool, cfg.Schema)
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	store, err := inbox.NewStore(inbox.StoreConfig{Schema: schema, Consumer: cfg.Consumer,
		DedupePolicy: cfg.DedupePolicy, MaxAttempts: cfg.MaxAttempts})
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	h, mode := cfg.Handler, "Go handler"
	switch {
	case cfg.SQLFunction != "":
		s, err := handlers.NewSQL(handlers.SQLConfig{Function: cfg.SQLFunction})
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		h, mode = s.Handle, fmt.Sprintf("SQL function %s", cfg.SQLFunction)
	case cfg.HTTPURL != "":
		hc := handlers.HTTPConfig{URL: cfg.HTTPURL, Consumer: cfg.Consumer, Client: cfg.HTTPClient, Header: cfg.HTTPHeader,
			DedupeKey: func(_ context.Context, ev envelope.Event) string {
				k, _ := store.DedupeKey(inbox.Delivery{Event: ev, Kafka: cfg.Kafka})
				return k
			}}
		hh, err := handlers.NewHTTP(hc)
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		defer hh.CloseIdleConnections()
		h, mode = hh.Handle, fmt.Sprintf("HTTP endpoint %s", cfg.HTTPURL)
	}
	d := inbox.Delivery{Event: ev, Kafka: cfg.Kafka}
	res, err := store.Process(ctx, pool, d, h)
	if err != nil {
		t.Fatalf("%s: deliver message %q to the %s: %v", who, ev.MessageID, mode, err)
	}
	out := Delivered{Result: res}
	switch {
	case cfg.Want != 0 && res.Outcome != cfg.Want:
		t.Fatalf("%s: delivering message %q (%s) to the %s: want outcome %s, got %s%s",
			who, ev.MessageID, ev.EventType, mode, cfg.Want, res.Outcome, errSuffix(res.Err))
	case cfg.Want == 0 && res.Outcome != inbox.Processed && res.Outcome != inbox.Duplicate:
		t.Fatalf("%s: delivering message %q (%s) to the %s failed: outcome %s%s "+
			"(set DeliverConfig.Want to the outcome when the test expects a failure)",
			who, ev.MessageID, ev.EventType, mode, res.Outcome, errSuffix(res.Err))
	}
	if !cfg.Twice {
		return out
	}
	if res.Outcome != inbox.Processed {
		t.Fatalf("%s: Twice needs the first delivery of message %q (%s) to the %s to be processed, but it was %s%s",
			who, ev.MessageID, ev.EventType, mode, res.Outcome, errSuffix(res.Err))
	}
	again, err := store.Process(ctx, pool, d, h)
	if err != nil {
		t.Fatalf("%s: deliver message %q to the %s a second time: %v", who, ev.MessageID, mode, err)
	}
	out.Redelivery = &again
	if again.Outcome != inbox.Duplicate {
		t.Fatalf("%s: the second delivery of message %q (%s) to the %s was not suppressed: want outcome %s, got %s%s",
			who, ev.MessageID, ev.EventType, mode, inbox.Duplicate, again.Outcome, errSuffix(again.Err))
	}
	return out
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// JSONEvent returns a valid event of type eventType whose payload is payload encoded as JSON:
// a random message id, source "keirotest", destination "keirotest.events", schema version 1,
// content type application/json and the current time. Set the other fields (Key, Source,
// Destination) on the result as the test needs.
func JSONEvent(t testing.TB, eventType string, payload any) envelope.Event {
	t.Helper()
	p, err := json.Marshal(payload)
	if err != nil {
		t.Fatalf("keirotest.JSONEvent: encode the payload of a %s as JSON: %v", eventType, err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	return envelope.Event{
		MessageID: "keirotest-" + hex.EncodeToString(id[:]), Source: "keirotest", Destination: "keirotest.events",
		EventType: eventType, SchemaVersion: 1, ContentType: envelope.ContentTypeJSON, Payload: p,
		OccurredAt: time.Now().UTC().Truncate(time.Millisecond),
	}
}
