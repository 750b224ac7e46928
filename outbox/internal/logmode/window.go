package logmode

import (
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// window is the engine's account of the transactions it has read from the slot and not yet
// confirmed, in commit order, and of the records they have in flight. It decides the one
// position the engine may confirm to PostgreSQL: the end of the longest prefix of
// transactions that are committed (their Commit message was read) and whose records Kafka
// has all acknowledged (or refused for good). A transaction with a record that failed
// otherwise stops the prefix for good: the session ends and the next one replays from it.
//
// Under exactly once, a transaction with a record in a Kafka transaction is confirmed only
// once that Kafka transaction committed (kafkaCommitted): the slot never confirms what Kafka
// may still abort. A transaction without one (skipped, filtered, its records all rejected
// before Kafka) needs no Kafka commit of its own, but follows the prefix rule all the same.
//
// The server's WAL end, as a keepalive reports it, is confirmed only when the window is
// empty: no transaction open, no record in flight. Confirming it while records are in flight
// would let a restart skip them.
type window struct {
	mu        sync.Mutex
	txns      []*txn // read, not yet confirmed, in commit order; txns[0] is the oldest
	confirmed pglogrepl.LSN
	records   int // in flight
	bytes     int // in flight
	failed    error
	settled   chan struct{} // receives (without blocking) whenever a record settles
	// commitSettled receives (without blocking) whenever a transaction's last record settles or
	// a record fails, for the Kafka commit under way (exactly once), which waits on its own
	// records while the stream reads on (settledThrough).
	commitSettled chan struct{}
	// kafka is, under exactly once, the end of the last PostgreSQL transaction a committed
	// Kafka transaction holds: a transaction with records in Kafka is confirmed only once
	// its end is at or before it.
	kafka pglogrepl.LSN
}

// txn is one decoded transaction.
type txn struct {
	end       pglogrepl.LSN // the Commit message's TransactionEndLSN
	at        time.Time     // the Begin message's commit time
	final     pglogrepl.LSN // the Begin message's FinalLSN: where its commit record starts
	pending   int           // records produced, not settled
	committed bool
	failed    bool
	kafka     bool // a record of it is in a Kafka transaction (exactly once)
}

// newWindow starts an empty window at the slot's confirmed position.
func newWindow(confirmed pglogrepl.LSN) *window {
	return &window{confirmed: confirmed, settled: make(chan struct{}, 1), commitSettled: make(chan struct{}, 1)}
}

// begin opens a transaction (a Begin message) that committed at at, its commit record at final.
func (w *window) begin(at time.Time, final pglogrepl.LSN) *txn {
	t := &txn{at: at, final: final}
	w.mu.Lock()
	w.txns = append(w.txns, t)
	w.mu.Unlock()
	return t
}

// add counts a record of t, of size bytes, as in flight; inTxn if it is produced in a Kafka
// transaction (exactly once), which must commit before t is confirmed.
func (w *window) add(t *txn, size int, inTxn bool) {
	w.mu.Lock()
	t.kafka = t.kafka || inTxn
	t.pending++
	w.records++
	w.bytes += size
	w.mu.Unlock()
}

// commit closes t at end (a Commit message) and confirms what it can.
func (w *window) commit(t *txn, end pglogrepl.LSN) {
	w.mu.Lock()
	t.committed, t.end = true, end
	w.advance()
	w.mu.Unlock()
}

// settle accounts a record of t, of size bytes, as acknowledged or refused for good (failed
// false), or as failed otherwise (failed true, err the failure: t is never confirmed, and
// neither is any transaction after it).
func (w *window) settle(t *txn, size int, err error) {
	w.mu.Lock()
	t.pending--
	w.records--
	w.bytes -= size
	if err != nil {
		t.failed = true
		if w.failed == nil {
			w.failed = err
		}
	}
	w.advance()
	last := t.pending == 0 || err != nil
	w.mu.Unlock()
	select {
	case w.settled <- struct{}{}:
	default:
	}
	if last {
		select {
		case w.commitSettled <- struct{}{}:
		default:
		}
	}
}

// advance confirms the committed, settled prefix. w.mu is held.
func (w *window) advance() {
	n := 0
	for _, t := range w.txns {
		if !t.committed || t.pending > 0 || t.failed || t.kafka && t.end > w.kafka {
			break
		}
		if t.end > w.confirmed {
			w.confirmed = t.end
		}
		n++
	}
	if n > 0 {
		clear(w.txns[:n])
		w.txns = w.txns[n:]
	}
}

// kafkaCommitted takes the end of the last PostgreSQL transaction of a Kafka transaction that
// committed (exactly once), and confirms what it can.
func (w *window) kafkaCommitted(end pglogrepl.LSN) {
	w.mu.Lock()
	if end > w.kafka {
		w.kafka = end
	}
	w.advance()
	w.mu.Unlock()
}

// settledThrough reports whether every record of the transactions that end at or before end
// has settled (its dead letter, if rejected, written), and the failure of one of them, if any:
// the records of a Kafka transaction through end (exactly once), which may commit only then
// and only without such a failure. Transactions after end (the next Kafka transaction's, read
// meanwhile) do not count.
func (w *window) settledThrough(end pglogrepl.LSN) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.txns {
		if !t.committed || t.end > end {
			break
		}
		if t.failed {
			return true, w.failed
		}
		if t.pending > 0 {
			return false, nil
		}
	}
	return true, nil
}

// keepalive takes the server's WAL end from a keepalive: confirmed only if nothing is open
// or in flight.
func (w *window) keepalive(walEnd pglogrepl.LSN) {
	w.mu.Lock()
	if len(w.txns) == 0 && w.records == 0 && walEnd > w.confirmed {
		w.confirmed = walEnd
	}
	w.mu.Unlock()
}

// position returns the position the engine may confirm.
func (w *window) position() pglogrepl.LSN {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.confirmed
}

// full reports whether the records in flight reached either bound.
func (w *window) full(maxRecords, maxBytes int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.records >= maxRecords || w.bytes >= maxBytes
}

// inFlight returns the records in flight.
func (w *window) inFlight() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.records
}

// err returns the first failure of a record, if any.
func (w *window) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}
