package logmode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// ErrSlotActive reports that another reader holds the slot: the engine is on standby.
var ErrSlotActive = errors.New("replication slot is active for another reader")

// Engine publishes keiro_outbox_log's rows to Kafka by following a logical replication slot.
// Build it with New; run it with Run. One engine per slot is active at a time; others wait.
type Engine struct {
	cfg      logsource.Config
	conn     *pgconn.Config
	pub      *publish.Publisher // the relay's: its client's options build producer
	producer *kgo.Client        // the engine's own, built by Run from pub's client's options
	log      *slog.Logger

	published atomic.Int64
	rejected  atomic.Int64
	sessions  atomic.Int64
	suspects  publish.Suspects[string]

	// Exactly once (cfg.ExactlyOnce set).
	txnID      atomic.Pointer[string] // the slot's transactional id, once a session computed it
	eoCounters *exactlyonce.Counters  // the transactions of every session's producer: ExactlyOnce.Counters
	refused    refusals               // records Kafka refused inside a transaction

	// Test hooks, set before Run.
	onActive     func()                     // a session started replicating
	onStandby    func(pid int)              // the slot was found active for pid
	onSessionEnd func(err error)            // a session ended with err (the engine goes on)
	onAck        func(id string)            // Kafka acknowledged the record of message id
	onKeepalive  func(walEnd pglogrepl.LSN) // a keepalive reported the server's WAL end
	onReport     func(pos pglogrepl.LSN)    // a status update confirmed pos
	onCommit     func(end pglogrepl.LSN)    // a transaction's Commit was read

	onCommitStarted   func(pos pglogrepl.LSN) // the stream handed the Kafka transaction through pos to its commit
	beforeKafkaCommit func(pos pglogrepl.LSN) // a Kafka transaction through pos is about to commit
	onKafkaCommit     func(pos pglogrepl.LSN) // a Kafka transaction through pos committed
	holdReports       bool                    // send no status update: the slot's position stays
	holdCommits       bool                    // the stream commits no Kafka transaction; Run's end does
}

// Stats are an engine's counters since New.
type Stats struct {
	// Published counts records Kafka acknowledged. Under exactly once, a record is
	// acknowledged inside its Kafka transaction, which may still abort (and its replay be
	// acknowledged again): the transactions committed are ExactlyOnce's counters.
	Published int64
	// Rejected counts the rejected events whose dead letter the publisher wrote.
	Rejected int64
	// Sessions counts the sessions that started replicating.
	Sessions int64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	return Stats{Published: e.published.Load(), Rejected: e.rejected.Load(), Sessions: e.sessions.Load()}
}

// New returns an engine that reads the slot of cfg on the database of connString (a
// PostgreSQL URL or key=value DSN; the engine adds replication=database, and the role needs
// the REPLICATION attribute) and publishes through pub, whose client was checked by
// publish.New. The engine does not produce with that client itself: Run builds a client of
// its own from its options (see producerOpts), closed when Run returns.
func New(connString string, pub *publish.Publisher, cfg logsource.Config) (*Engine, error) {
	cfg = cfg.WithDefaults()
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	conn, err := pgconn.ParseConfig(connString)
	if err != nil {
		errs = append(errs, fmt.Errorf("connection string: %w", err))
	} else {
		conn.RuntimeParams["replication"] = "database"
		if cfg.ApplicationName != "" {
			conn.RuntimeParams["application_name"] = cfg.ApplicationName
		}
	}
	if pub == nil {
		errs = append(errs, errors.New("publisher is nil"))
	} else if n := pub.MaxBufferedRecords(); n > 0 && n < cfg.MaxInFlightRecords {
		errs = append(errs, fmt.Errorf("client: MaxBufferedRecords (%d) must be at least MaxInFlightRecords (%d)", n, cfg.MaxInFlightRecords))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new log-mode relay: %w", err)
	}
	e := &Engine{cfg: cfg, conn: conn, pub: pub, log: cfg.Logger}
	if cfg.ExactlyOnce != nil {
		e.eoCounters = cfg.ExactlyOnce.Counters // set by WithDefaults: the relay's metrics read them
	}
	return e, nil
}

// Published counts the records Kafka acknowledged (logsource.Engine).
func (e *Engine) Published() int64 { return e.published.Load() }

// Sessions counts the sessions that started replicating (logsource.Engine).
func (e *Engine) Sessions() int64 { return e.sessions.Load() }

// ExactlyOnce returns, under exactly once, the slot's transactional id (empty until a session
// held the slot and computed it) and the counters of the engine's Kafka transactions (committed,
// aborted, fenced); at least once, "" and nil (logsource.Engine).
func (e *Engine) ExactlyOnce() (txnID string, counters *exactlyonce.Counters) {
	if e.cfg.ExactlyOnce == nil {
		return "", nil
	}
	if id := e.txnID.Load(); id != nil {
		txnID = *id
	}
	return txnID, e.eoCounters
}

// producerOpts override the caller's client options for the engine's own client: franz-go
// retries a record until it is acknowledged or refused for good. A partition whose produce
// fails with a retriable error (leader moved, request timed out, topic not yet known) is held
// by franz-go itself, its records kept in order, while every other partition goes on. Only a
// refusal no retry mends reaches the engine: a record too large or invalid, or of a topic
// still unknown after UnknownTopicRetries metadata refreshes, is rejected and the stream
// moves on; any other (the cluster not authorized, the client closed) ends the session. The window
// bounds what waits meanwhile: past MaxInFlightRecords or MaxInFlightBytes the engine stops
// reading the slot. The caller's bounded retries suit the claim relay, which classifies
// errors itself and never has two records of a key in flight; here many records of a key
// are, and a record failed after its retries would end the session, stall every partition
// for the replay, and could let a later record of its key be acknowledged before it.
func producerOpts(client *kgo.Client, unknownTopicRetries int) []kgo.Opt {
	return append(slices.Clone(client.Opts()),
		kgo.RecordRetries(math.MaxInt), // franz-go's unlimited default
		kgo.RecordDeliveryTimeout(0),   // no delivery timeout
		// A topic not (yet) known is waited for a bounded number of metadata refreshes:
		// then its records fail with UNKNOWN_TOPIC_OR_PARTITION and are rejected
		// (kafkaerr.OfLogRecord), as a claim-mode row dies after its attempts.
		kgo.UnknownTopicRetries(unknownTopicRetries),
	)
}

// Run follows the slot until ctx is cancelled, then waits up to ShutdownTimeout for the
// records in flight, confirms what Kafka acknowledged, and returns nil. While another reader
// holds the slot it waits on standby, trying again every StandbyRetry. A session that fails
// (PostgreSQL lost, a record Kafka refused other than for good, such as for authorization) is
// followed by a new one after RetryBackoff, which replays from the confirmed position. Run
// returns an error only for a failure no retry can mend: wal_level is not logical, the role
// lacks the REPLICATION privilege, the table or the slot's plugin is wrong.
//
// Run produces with a client of its own, built from the options of New's client with
// unlimited record retries (see producerOpts), and closes it when it returns. One client
// serves every session of a Run: the records a held partition still buffers when a session
// ends stay ahead of the next session's replay of them, in order.
//
// Under exactly once (Config.ExactlyOnce), each session instead builds a transactional
// producer once it holds the slot, and closes it when it ends: the records of a session
// that failed were aborted with its Kafka transaction, and nothing of it may precede the replay.
func (e *Engine) Run(ctx context.Context) error {
	if e.cfg.ExactlyOnce == nil {
		producer, err := kgo.NewClient(producerOpts(e.pub.Client(), e.cfg.UnknownTopicRetries)...)
		if err != nil {
			return fmt.Errorf("log mode: build the producer: %w", err)
		}
		e.producer = producer
		defer producer.Close()
	}
	standby := false
	for {
		err := e.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if e.onSessionEnd != nil {
			e.onSessionEnd(err)
		}
		var wait time.Duration
		var active *slotActiveError
		switch {
		case errors.As(err, &active):
			if !standby {
				e.log.InfoContext(ctx, "log mode: the slot is active for another reader; waiting on standby",
					"slot", e.cfg.Slot, "pid", active.pid)
			}
			standby = true
			if e.onStandby != nil {
				e.onStandby(active.pid)
			}
			wait = e.cfg.StandbyRetry
		case fatal(err):
			return fmt.Errorf("log mode: %w", err)
		case errors.Is(err, exactlyonce.ErrFenced):
			// A newer engine initialized the slot's transactional id: it holds the slot
			// now, and this one's transaction was aborted. The next session finds the slot
			// active (standby) or, if the newer one is gone, takes it over.
			standby = false
			e.log.ErrorContext(ctx, "log mode: fenced: another relay took over the slot's transactional id; its transaction is aborted and this relay goes back to the slot",
				"slot", e.cfg.Slot, "err", err)
			wait = e.cfg.RetryBackoff
		default:
			standby = false
			e.log.WarnContext(ctx, "log mode: session ended; replaying from the confirmed position",
				"slot", e.cfg.Slot, "err", err, "backoff", e.cfg.RetryBackoff)
			wait = e.cfg.RetryBackoff
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// slotActiveError is ErrSlotActive with the pid of the active reader (0 when unknown).
type slotActiveError struct{ pid int }

func (e *slotActiveError) Error() string {
	if e.pid == 0 {
		return ErrSlotActive.Error()
	}
	return fmt.Sprintf("%s (pid %d)", ErrSlotActive, e.pid)
}

func (e *slotActiveError) Is(target error) bool { return target == ErrSlotActive }

// fatal reports errors that a new session cannot mend.
func fatal(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return errors.Is(err, errConfig)
	}
	switch pgErr.Code {
	case "55000", // object_not_in_prerequisite_state: wal_level is not logical
		"42501", // insufficient_privilege
		"42P01", // undefined_table: keiro_outbox_log is missing
		"28000": // invalid_authorization_specification: no replication entry in pg_hba.conf
		return true
	}
	return false
}

// errConfig marks a setup the engine cannot work with.
var errConfig = errors.New("log mode setup")
