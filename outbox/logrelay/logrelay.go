// Package logrelay is the outbox relay's log engine: set it on the relay's configuration,
//
//	cfg := outbox.RelayConfig{Mode: outbox.ModeLog, LogEngine: logrelay.Engine}
//
// The relay then follows a logical replication slot of keiro_outbox_log (pgoutput, through
// github.com/jackc/pglogrepl) and publishes in commit order, confirming to PostgreSQL only the
// end of transactions whose records Kafka acknowledged (docs/architecture.md, "Log mode"). It
// is a package of its own so that a service in claim mode does not link the replication
// client; cmd/relay uses it.
package logrelay

import (
	"github.com/keiro-go/keiro/outbox/internal/logmode"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// Engine builds the log engine of a relay in outbox.ModeLog: set it as
// outbox.RelayConfig.LogEngine. The relay calls it with its database, its publisher and the
// engine's settings taken from its RelayConfig.
func Engine(connString string, pub *publish.Publisher, cfg logsource.Config) (logsource.Engine, error) {
	e, err := logmode.New(connString, pub, cfg)
	if err != nil {
		return nil, err
	}
	return e, nil
}
