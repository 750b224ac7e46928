package outbox

import (
	"slices"

	"github.com/keiro-go/keiro/envelope"
)

// encodeOptions are the header options of a record for destination: the CloudEvents
// binary-mode profile when RelayConfig.CloudEvents is set or destination is one of
// RelayConfig.CloudEventsDestinations.
func (r *Relay) encodeOptions(destination string) envelope.EncodeOptions {
	return envelope.EncodeOptions{
		CloudEvents: r.cfg.CloudEvents || slices.Contains(r.cfg.CloudEventsDestinations, destination),
	}
}
