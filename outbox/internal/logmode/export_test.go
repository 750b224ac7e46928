package logmode

import "github.com/jackc/pglogrepl"

// Hooks are the engine's test signals.
type Hooks struct {
	// OnActive is called when a session starts replicating.
	OnActive func()
	// OnStandby is called each time the slot is found active for another reader.
	OnStandby func(pid int)
	// OnAck is called when Kafka acknowledges the record of a message id.
	OnAck func(id string)
	// OnKeepalive is called with the server's WAL end of each keepalive.
	OnKeepalive func(walEnd pglogrepl.LSN)
	// OnCommit is called with the end of each transaction read.
	OnCommit func(end pglogrepl.LSN)
	// OnReport is called with each position a status update confirmed.
	OnReport func(pos pglogrepl.LSN)
}

// SetHooks installs h; call it before Run.
func SetHooks(e *Engine, h Hooks) {
	e.onActive, e.onStandby, e.onAck = h.OnActive, h.OnStandby, h.OnAck
	e.onKeepalive, e.onReport, e.onCommit = h.OnKeepalive, h.OnReport, h.OnCommit
}
