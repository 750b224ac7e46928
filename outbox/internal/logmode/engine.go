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
)

// ErrSlotActive reports that another reader holds the slot: the engine is on standby.
var ErrSlotActive = errors.New("replication slot is active for another reader")

// Engine publishes keiro_outbox_log's rows to Kafka by following a logical replication slot.
// Build it with New; run it with Run. One engine per slot is active at a time; others wait.
type Engine struct {
	cfg            Config
	conn           *pgconn.Config
	client         *kgo.Client // the caller's: its options build producer
	producer       *kgo.Client // the engine's own, built by Run from client's options
	log            *slog.Logger
	maxRecordBytes int

	published atomic.Int64
	rejected  atomic.Int64
	sessions  atomic.Int64
	suspects  suspects

	deadLetters deadLetters // OnRejected's slots (produce.go)

	// Test hooks, set before Run.
	onActive    func()                     // a session started replicating
	onStandby   func(pid int)              // the slot was found active for pid
	onAck       func(id string)            // Kafka acknowledged the record of message id
	onKeepalive func(walEnd pglogrepl.LSN) // a keepalive reported the server's WAL end
	onReport    func(pos pglogrepl.LSN)    // a status update confirmed pos
	onCommit    func(end pglogrepl.LSN)    // a transaction's Commit was read
}

// Stats are an engine's counters since New.
type Stats struct {
	// Published counts records Kafka acknowledged.
	Published int64
	// Rejected counts the rejected events whose dead letter OnRejected wrote.
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
// the REPLICATION attribute) and produces with client. client must be built with the claim
// relay's producer options (outbox.ProducerOpts: acks from all in-sync replicas, idempotent
// writes, manual flushing). The engine does not produce with client itself: Run builds a
// client of its own from client's options (see producerOpts), closed when Run returns.
func New(connString string, client *kgo.Client, cfg Config) (*Engine, error) {
	cfg = cfg.withDefaults()
	var errs []error
	if err := cfg.validate(); err != nil {
		errs = append(errs, err)
	}
	conn, err := pgconn.ParseConfig(connString)
	if err != nil {
		errs = append(errs, fmt.Errorf("connection string: %w", err))
	} else {
		conn.RuntimeParams["replication"] = "database"
	}
	maxRecord := cfg.MaxRecordBytes
	if client == nil {
		errs = append(errs, errors.New("client is nil"))
	} else {
		if acks, ok := client.OptValue(kgo.RequiredAcks).(kgo.Acks); !ok || acks != kgo.AllISRAcks() {
			errs = append(errs, errors.New("client: RequiredAcks must be AllISRAcks; build it with outbox.ProducerOpts()"))
		}
		if dis, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); dis {
			errs = append(errs, errors.New("client: idempotent writes are disabled; build it with outbox.ProducerOpts()"))
		}
		if manual, _ := client.OptValue(kgo.ManualFlushing).(bool); !manual {
			errs = append(errs, errors.New("client: ManualFlushing is required; build it with outbox.ProducerOpts()"))
		}
		if n, ok := client.OptValue(kgo.MaxBufferedRecords).(int64); ok && n < int64(cfg.MaxInFlightRecords) {
			errs = append(errs, fmt.Errorf("client: MaxBufferedRecords (%d) must be at least MaxInFlightRecords (%d)", n, cfg.MaxInFlightRecords))
		}
		if b, ok := client.OptValue(kgo.ProducerBatchMaxBytes).(int32); ok && (maxRecord == 0 || int(b) < maxRecord) {
			maxRecord = int(b)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new log-mode relay: %w", err)
	}
	if maxRecord == 0 {
		maxRecord = 1_000_012 // franz-go's default ProducerBatchMaxBytes
	}
	return &Engine{cfg: cfg, conn: conn, client: client, log: cfg.Logger, maxRecordBytes: maxRecord}, nil
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
func (e *Engine) Run(ctx context.Context) error {
	producer, err := kgo.NewClient(producerOpts(e.client, e.cfg.UnknownTopicRetries)...)
	if err != nil {
		return fmt.Errorf("log mode: build the producer: %w", err)
	}
	e.producer = producer
	defer producer.Close()
	standby := false
	for {
		err := e.session(ctx)
		if ctx.Err() != nil {
			return nil
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
