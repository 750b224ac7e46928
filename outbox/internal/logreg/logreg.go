// Package logreg is where the log-mode engine registers itself with the outbox: outbox
// reads New, and the opt-in package outbox/logrelay sets it when it is imported. The outbox
// package (and a claim-mode service) therefore does not link the logical replication client.
package logreg

import (
	"context"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
)

// Config is what the relay gives the engine.
type Config struct {
	// ConnString is the database's connection string (the engine adds replication=database).
	ConnString string
	// Schema holds keiro_outbox_log; Slot is the slot and publication.
	Schema, Slot string
	// Destinations restricts the engine to these destinations' records (nil: all).
	Destinations []string
	// Client is the relay's producer.
	Client *kgo.Client
	// MaxInFlightRecords and MaxRecordBytes bound the produce; ShutdownTimeout the wait at stop.
	MaxInFlightRecords, MaxRecordBytes int
	ShutdownTimeout                    time.Duration
	// UnknownTopicRetries bounds the wait of a record for a topic Kafka does not know
	// (logmode.Config.UnknownTopicRetries).
	UnknownTopicRetries int
	// CloudEvents and CloudEventsDestinations are the relay's CloudEvents settings.
	CloudEvents             bool
	CloudEventsDestinations []string
	// Logger receives the engine's logs.
	Logger *slog.Logger
	// OnRejected writes the dead letter of each event Kafka refused for good; the engine
	// confirms the event's transaction only once it returned nil.
	OnRejected func(Rejection) error
	// OnSend is called before each record is produced (logmode.Config.OnSend): it starts the
	// send span and returns the record's trace context and the function that records its
	// outcome in the relay's metrics and ends the span.
	OnSend func(ev *envelope.Event, committed time.Time) (tc *envelope.TraceContext, done func(rec *kgo.Record, err error))
}

// Rejection is an event Kafka refused for good.
type Rejection struct {
	MessageID, Source, Destination, Code string
	Err                                  error
	// Event is the decoded event.
	Event *envelope.Event
}

// Engine is a log-mode engine.
type Engine interface {
	// Run follows the slot until ctx ends.
	Run(ctx context.Context) error
	// Published counts the records Kafka acknowledged.
	Published() int64
	// Sessions counts the sessions that started replicating.
	Sessions() int64
}

// New builds an engine; nil until outbox/logrelay is imported.
var New func(Config) (Engine, error)
