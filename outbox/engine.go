package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
	"github.com/keiro-go/keiro/outbox/internal/kafkaerr"
	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/logstart"
	"github.com/keiro-go/keiro/outbox/internal/maintain"
	"github.com/keiro-go/keiro/outbox/internal/metrics"
	"github.com/keiro-go/keiro/outbox/internal/publish"
	"github.com/keiro-go/keiro/outbox/internal/shares"
	"github.com/keiro-go/keiro/outbox/internal/translog"
)

// engine is a relay's machinery: its two sources (the claim loop, and in ModeLog the log
// engine) feeding one publisher, and the services beside them.
type engine struct {
	pool *pgxpool.Pool
	cfg  RelayConfig
	// eo is how the relay's engines publish exactly once (RelayConfig.ExactlyOnce), with the
	// counters of their transactions; nil: at least once.
	eo    *exactlyonce.Config
	store *Store
	// claims runs the claim relay's statements.
	claims *claimsql.Store
	inst   *metrics.Instruments
	// maint runs the maintenance passes.
	maint *maintain.Maintainer
	log   *slog.Logger
	// pub turns rows into records for both sources, the claim loop and the log engine.
	pub  *publish.Publisher
	wake chan struct{}
	// suspects are the rows produced alone next time (publish.Suspects), by outbox id.
	suspects publish.Suspects[envelope.UUID]
	// topics are the destinations this relay's client has published to. The first record
	// for any other topic is produced alone: franz-go holds records for a topic it has no
	// metadata for aside and hands them to their partitions one by one once the metadata
	// arrives; during a flush the first ones can go out (and fail) in one request while the
	// rest are still being handed over and go out in the next, so a failure could be followed
	// by a success of later records of the same key.
	topics sync.Map // topic name → struct{}
	// logEngine follows the slot in ModeLog (relay.go); nil in ModeClaim.
	logEngine logsource.Engine
	// logStart starts the log source beside the claim loop in ModeLog; nil in ModeClaim.
	logStart *logstart.Starter
	// ackHook, if set (benchmarks), is called with each acknowledged row's message id.
	ackHook func(messageID string)
	// sleepHook, if set (tests), runs before each try of the sleep lock.
	sleepHook func()
	// flushHook, if set (tests), runs before each flush's lease check.
	flushHook func()
	// claimHook, if set (tests), runs at the start of each claim statement's turn (before the
	// release of lost claims); markHook before each try of a batch's mark statement.
	claimHook, markHook func()
	// afterModeRead, if set (tests), runs in ModeLog between the relay's read of the schema's
	// mode and the preparation of its slot.
	afterModeRead func()
	// beforeCommit and afterCommit, if set (tests), run before an exactly-once transaction
	// ends and after it committed (before its batches are marked); recoverHook before the
	// recovery settles the rows of a lost claim's transactional id. frozen (tests) stops the
	// lease renewals: the relay stands for one that died or froze.
	beforeCommit, afterCommit func()
	recoverHook               func(txn string)
	frozen                    atomic.Bool
	// eosStats are the exactly-once counters (eosclaim.go).
	eosStats eosStats
	// now is the relay's clock (time.Now; tests inject one): leases are timed with its
	// monotonic reading, so a wall-clock step neither shortens nor stretches them.
	now          func() time.Time
	outageStreak atomic.Int64
	running      atomic.Bool
	// transitionLog rate-limits the log lines of retried, dead and rejected rows.
	transitionLog translog.Log
	// signals counts wake-ups (notifications, finished batches), so a claimer can tell that one
	// happened while its claim ran.
	signals atomic.Int64
	// listening is set while the LISTEN session is up: only then may the relay sleep under
	// the sleep lock (producers' notifications would otherwise go unheard).
	listening atomic.Bool
	// inFlight counts the claimed batches not yet marked; each wakes the first claimer when
	// marked. (An extra claimer's claim in progress is not counted: if it takes rows, their
	// batch will; if not, nothing will, and the first claimer must not wait on it.)
	inFlight atomic.Int64
	// backlogged is set while claims come back full; backlog wakes the extra claimers then.
	backlogged atomic.Bool
	backlog    chan struct{}
	// flying holds the batches claimed and not yet marked, for renewLeases.
	flying sync.Map // *claimedBatch → struct{}
	// lost holds the claims whose reply did not arrive: they may have committed, holding
	// their rows under a lease nobody renews. Each claim first releases them (claimloop.go).
	lostMu sync.Mutex
	lost   []lostClaim
	// shares are the claim shares this relay prefers while the backlog is deep (internal/shares);
	// nil for a PollOnly relay. shareHook, if set (tests), runs before each balance step.
	shares    *shares.Set
	shareHook func(ctx context.Context)

	stats struct {
		claims, claimed, batches, published, retried, skipped, dead, rejected, released, reclaimed,
		deferred, claimErrors, markErrors, orderBroken, leaseRenewals, leaseLost, marksAbandoned, shareClaims, vacuums atomic.Int64
		// sharesDrained counts the claims of the relay's own shares that came back empty
		// (the relay then claimed from every share for a poll interval): for benchmarks.
		sharesDrained atomic.Int64
	}
}

// ownConnConfig is the configuration of a connection the relay opens beside pool (its LISTEN,
// claim-share and vacuum sessions): pool's, named with the relay's [ApplicationName], so the
// relay is seen in pg_stat_activity (and counted by the console) however pool is configured.
func ownConnConfig(pool *pgxpool.Pool, schema string) *pgx.ConnConfig {
	cc := pool.Config().ConnConfig.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = ApplicationName(schema)
	return cc
}

// claimedBatch is one claim travelling through the pipeline.
type claimedBatch struct {
	token envelope.UUID
	rows  []claimsql.Row

	mu      sync.Mutex
	results []produceResult // per row, written by produce callbacks
	closed  bool            // set when the producer stops waiting: late callbacks are ignored
	// leasedAt is when the batch's lease last started (its claim, or its last renewal), read
	// before the statement was sent, so never later than the database's start of the lease;
	// marking is set when its mark begins (rows the mark moves no longer count as renewed, so
	// a renewal then reports no lost lease); lost, once a renewal found rows taken over by
	// another relay.
	leasedAt      time.Time
	marking, lost bool
	// expired is set when a flush found the lease lost or too close to its end: the batch's
	// rows left are not produced.
	expired bool
	// markLanded is set once the batch's mark committed (an abandoned one does not).
	markLanded bool
	// noMark: under ExactlyOnce, the outcome of the transaction holding the batch's records
	// could not be learnt; the batch is not marked, and its rows are left to the recovery of
	// its transactional id by another relay once their lease expires (eosclaim.go).
	noMark bool
}

// signal wakes the claim loop without blocking.
func (r *engine) signal() {
	r.signals.Add(1)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// ApplicationNamePrefix starts the PostgreSQL application_name of every relay's own session:
// "keiro-relay:SCHEMA@HOST/PID" ([ApplicationName]). The operator console counts the distinct
// names of a schema's relays among the database's sessions as the relays connected.
const ApplicationNamePrefix = "keiro-relay:"

// maxApplicationName is PostgreSQL's limit on application_name (NAMEDATALEN-1 bytes).
const maxApplicationName = 63

// ApplicationName is the application_name of a relay process publishing the outbox of schema:
// "keiro-relay:SCHEMA@HOST/PID", the schema cut to 32 bytes and the host shortened so that the
// whole fits PostgreSQL's 63 bytes. A relay sets it on its LISTEN session, the connection it
// opens for itself, whatever the pool's application_name; a PollOnly relay has no session of
// its own, and is seen as a relay only when its pool's connections carry this name (the relay
// binary sets it on its pool unless the database URL names one).
func ApplicationName(schema string) string {
	host, _ := os.Hostname()
	prefix := SchemaApplicationNamePrefix(schema)
	suffix := fmt.Sprintf("/%d", os.Getpid())
	if over := len(prefix) + len(host) + len(suffix) - maxApplicationName; over > 0 {
		host = host[:max(0, len(host)-over)]
	}
	return prefix + host + suffix
}

// SchemaApplicationNamePrefix is the start of the [ApplicationName] of every relay of schema,
// whatever its host and process: "keiro-relay:SCHEMA@", the schema cut to its first 32 bytes.
func SchemaApplicationNamePrefix(schema string) string {
	return ApplicationNamePrefix + schema[:min(len(schema), 32)] + "@"
}

// lostClaim is a claim whose reply did not arrive (the connection broke, the backend was
// terminated): it may have committed, leaving its rows publishing under its token with a lease
// that nobody renews, and their keys stalled until it expires.
type lostClaim struct {
	token envelope.UUID
	pid   uint32    // the backend that ran it
	at    time.Time // when it was sent, on the relay's clock
}

type produceResult struct {
	done      bool
	err       error
	partition int32
	offset    int64
	// rejectCode and rejectMsg are a rejection before the produce: an illegal topic
	// (kafkaerr.CheckTopic) or a record too large.
	rejectCode, rejectMsg string
	// shared: other records of the flush went to the same partition, so a record-level
	// refusal (MESSAGE_TOO_LARGE, ...) cannot be pinned on this record.
	shared bool
	// leaseLost: the row was not produced because its batch's lease was lost or about to
	// expire (holdLeases).
	leaseLost bool
}

// failureClass is how the relay treats a failed record (kafkaerr.OfRecord): produce and the
// mark must agree on it.
func (res *produceResult) failureClass() (kafkaerr.Class, string) {
	return kafkaerr.OfRecord(res.err, res.shared)
}

// deadLetterTimeout bounds one dead-letter write; past it the write counts as failed.
const deadLetterTimeout = 15 * time.Second

// deadLetter is the log-mode engine's dead-letter sink: it writes the rejected event as a
// 'rejected' row of keiro_outbox, where ListDead, Requeue, the console and the dead gauge
// read dead letters. The engine confirms the event's transaction only once it returned nil;
// an error ends the engine's session, and the next one replays the transaction and calls it
// again (the write is idempotent: a second one writes nothing).
func (r *engine) deadLetter(rej publish.Rejection) error {
	if rej.Event == nil {
		return fmt.Errorf("dead letter of message %s: no event", rej.MessageID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadLetterTimeout)
	defer cancel()
	errText := ""
	if rej.Err != nil {
		errText = rej.Err.Error()
	}
	wrote, err := r.store.writeDeadLetter(ctx, r.pool, rej.Event, rej.Code, errText)
	if err != nil {
		return err
	}
	if wrote {
		r.stats.rejected.Add(1)
		r.inst.Rejected.Add(ctx, 1, publish.DestinationAttr(rej.Destination))
	}
	r.log.Error("log mode: Kafka refused an event for good; it is a dead letter of keiro_outbox (relay dead list), and the stream moves on",
		"message_id", rej.MessageID, "source", rej.Source, "destination", rej.Destination,
		"code", rej.Code, "err", rej.Err, "written", wrote)
	return nil
}
