package logmode

import "github.com/jackc/pglogrepl"

// Hooks are the engine's test signals.
type Hooks struct {
	// OnActive is called when a session starts replicating.
	OnActive func()
	// OnStandby is called each time the slot is found active for another reader.
	OnStandby func(pid int)
	// OnSessionEnd is called with the error of each session that ended while the engine runs.
	OnSessionEnd func(err error)
	// OnAck is called when Kafka acknowledges the record of a message id.
	OnAck func(id string)
	// OnKeepalive is called with the server's WAL end of each keepalive.
	OnKeepalive func(walEnd pglogrepl.LSN)
	// OnCommit is called with the end of each transaction read.
	OnCommit func(end pglogrepl.LSN)
	// OnReport is called with each position a status update confirmed.
	OnReport func(pos pglogrepl.LSN)
	// OnCommitStarted is called when the stream hands the Kafka transaction through pos to its
	// commit (exactly once) and turns to the other producer, before the transaction's records
	// have settled.
	OnCommitStarted func(pos pglogrepl.LSN)
	// BeforeKafkaCommit is called before a Kafka transaction through pos commits (exactly
	// once), once its records settled, off the stream's goroutine; it may block.
	BeforeKafkaCommit func(pos pglogrepl.LSN)
	// OnKafkaCommit is called once a Kafka transaction through pos committed.
	OnKafkaCommit func(pos pglogrepl.LSN)
	// HoldReports sends no status update: the slot's confirmed position stays where it is.
	HoldReports bool
	// HoldCommits makes the stream commit no Kafka transaction: only Run's end does.
	HoldCommits bool
}

// SetHooks installs h; call it before Run.
func SetHooks(e *Engine, h Hooks) {
	e.onActive, e.onStandby, e.onAck = h.OnActive, h.OnStandby, h.OnAck
	e.onKeepalive, e.onReport, e.onCommit = h.OnKeepalive, h.OnReport, h.OnCommit
	e.beforeKafkaCommit, e.onKafkaCommit, e.holdReports = h.BeforeKafkaCommit, h.OnKafkaCommit, h.HoldReports
	e.holdCommits, e.onSessionEnd, e.onCommitStarted = h.HoldCommits, h.OnSessionEnd, h.OnCommitStarted
}
