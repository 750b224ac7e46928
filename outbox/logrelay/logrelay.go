// Package logrelay adds log mode to the outbox relay: import it for its side effect,
//
//	import _ "github.com/keiro-go/keiro/outbox/logrelay"
//
// and set outbox.RelayConfig.Mode to outbox.ModeLog. The relay then follows a logical
// replication slot of keiro_outbox_log (pgoutput, through github.com/jackc/pglogrepl) and
// publishes in commit order, confirming to PostgreSQL only the end of transactions whose
// records Kafka acknowledged (docs/architecture.md, "Log mode"). It is a package of its own so
// that a service in claim mode does not link the replication client; cmd/relay imports it.
package logrelay

import (
	"github.com/keiro-go/keiro/outbox/internal/logmode"
	"github.com/keiro-go/keiro/outbox/internal/logreg"
)

func init() { logreg.New = newEngine }

// engine adapts logmode.Engine to logreg.Engine.
type engine struct{ *logmode.Engine }

func (e engine) Published() int64 { return e.Stats().Published }

func (e engine) Sessions() int64 { return e.Stats().Sessions }

func newEngine(c logreg.Config) (logreg.Engine, error) {
	e, err := logmode.New(c.ConnString, c.Client, logmode.Config{
		Schema:                  c.Schema,
		Slot:                    c.Slot,
		Destinations:            c.Destinations,
		MaxInFlightRecords:      c.MaxInFlightRecords,
		MaxRecordBytes:          c.MaxRecordBytes,
		ShutdownTimeout:         c.ShutdownTimeout,
		UnknownTopicRetries:     c.UnknownTopicRetries,
		CloudEvents:             c.CloudEvents,
		CloudEventsDestinations: c.CloudEventsDestinations,
		Logger:                  c.Logger,
		OnSend:                  c.OnSend,
		OnRejected: func(r logmode.Rejection) error {
			if c.OnRejected == nil {
				return nil
			}
			return c.OnRejected(logreg.Rejection{MessageID: r.MessageID, Source: r.Source,
				Destination: r.Destination, Code: r.Code, Err: r.Err, Event: r.Event})
		},
	})
	if err != nil {
		return nil, err
	}
	return engine{e}, nil
}
