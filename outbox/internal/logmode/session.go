package logmode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/exactlyonce"
	"github.com/keiro-go/keiro/outbox/internal/kafkaerr"
	"github.com/keiro-go/keiro/outbox/internal/logmsg"
	"github.com/keiro-go/keiro/outbox/internal/logslot"
)

// session is one replication connection's life: set up the publication and the slot, start
// replicating from the slot's confirmed position, and stream until ctx ends or something
// fails.
func (e *Engine) session(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, e.conn)
	if err != nil {
		return fmt.Errorf("connect for replication: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	start, err := e.setup(ctx, conn)
	if err != nil {
		return err
	}
	var txnID string
	var walEnd pglogrepl.LSN
	if e.cfg.ExactlyOnce != nil {
		// The transactional id names the slot on this cluster; it is only computed here, and
		// the producer of it built (which fences the one before) once the slot is ours.
		sys, err := pglogrepl.IdentifySystem(ctx, conn)
		if err != nil {
			return fmt.Errorf("identify the system: %w", err)
		}
		txnID, walEnd = exactlyonce.LogTransactionalID(sys.SystemID, sys.DBName, e.cfg.Slot), sys.XLogPos
	}
	err = pglogrepl.StartReplication(ctx, conn, e.cfg.Slot, start, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names '" + e.cfg.Publication + "'",
			"binary 'true'",
			// The events Store.EmitTx writes (transactional logical messages, PostgreSQL 14+).
			"messages 'true'",
		},
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use
			return &slotActiveError{}
		}
		if pgErr != nil && pgErr.Code == "22023" { // invalid_parameter_value: an option pgoutput does not know
			return fmt.Errorf("%w: start replication from slot %s: %w; log mode needs PostgreSQL 14 or later "+
				"(pgoutput's messages option, for the events of EmitTx)", errConfig, e.cfg.Slot, err)
		}
		return fmt.Errorf("start replication from slot %s at %s: %w", e.cfg.Slot, start, err)
	}
	e.sessions.Add(1)
	if e.onActive != nil {
		e.onActive()
	}
	s := &stream{e: e, conn: conn, w: newWindow(start), relations: map[uint32]*layout{}, cl: e.producer,
		prefix: logmsg.Prefix(e.cfg.Schema)}
	if e.cfg.ExactlyOnce != nil {
		// Only now, the slot held: a standby that initialized the id would fence the active
		// engine.
		if err := s.startExactlyOnce(ctx, txnID, walEnd); err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), e.cfg.ShutdownTimeout)
			s.eo.Close(cctx)
			s.eoNext.Close(cctx)
			cancel()
		}()
	}
	e.log.InfoContext(ctx, "log mode: replicating", "slot", e.cfg.Slot, "from", start.String())
	return s.run(ctx)
}

// startExactlyOnce builds the session's two transactional producers, of txnID and of its
// LogPipelineID, which fences any earlier producer of the slot (a zombie engine) and aborts what
// it had open, then reads the position Kafka committed last: the stream skips every transaction
// at or before it, which covers a slot whose confirmed position lags behind Kafka (an engine
// that died after a Kafka commit and before its status update). A position past the server's
// WAL end (walEnd, as IDENTIFY_SYSTEM reported it) is refused: the database was restored to an
// earlier point (its system identifier stays), and skipping to the position would skip its new
// transactions.
func (s *stream) startExactlyOnce(ctx context.Context, txnID string, walEnd pglogrepl.LSN) error {
	e := s.e
	e.txnID.Store(&txnID)
	opts := producerOpts(e.pub.Client(), e.cfg.UnknownTopicRetries)
	var ps [2]*exactlyonce.Producer
	closeAll := func() {
		for _, p := range ps {
			if p != nil {
				p.Close(ctx)
			}
		}
	}
	for i, id := range []string{txnID, exactlyonce.LogPipelineID(txnID)} {
		cfg := *e.cfg.ExactlyOnce
		cfg.TransactionalID = id
		p, err := exactlyonce.NewProducer(ctx, opts, cfg, e.eoCounters)
		if err != nil {
			closeAll()
			return err
		}
		ps[i] = p
	}
	cfg := e.cfg.ExactlyOnce
	pos, err := exactlyonce.ReadPosition(ctx, opts, cfg.OffsetsTopic, txnID)
	switch {
	case errors.Is(err, exactlyonce.ErrNoRecord):
	case err != nil:
		closeAll()
		return fmt.Errorf("exactly once: read the position of %s: %w", txnID, err)
	case pglogrepl.LSN(pos.LSN) > walEnd:
		closeAll()
		return fmt.Errorf("%w: exactly once: Kafka's position of %s (%s, committed %s) is past the server's WAL end (%s): the database was restored to an earlier point; "+
			"check what Kafka already holds, then delete the position (a tombstone of key %q in %s) or use a new slot",
			errConfig, txnID, pglogrepl.LSN(pos.LSN), pos.At.Format(time.RFC3339), walEnd, exactlyonce.PositionKey(txnID), cfg.OffsetsTopic)
	default:
		s.skipThrough = pglogrepl.LSN(pos.LSN)
		s.w.kafka = s.skipThrough
	}
	s.txnID = txnID
	s.eo, s.eoNext, s.cl = ps[0], ps[1], ps[0].Client()
	e.log.InfoContext(ctx, "log mode: exactly once", "transactional_id", txnID,
		"kafka_position", s.skipThrough.String())
	return nil
}

// setup verifies the publication and the slot (logslot's rule, which the Store applies at
// the relay's start too), creates them if they do not exist, and returns the slot's confirmed
// position. A slot another reader holds is ErrSlotActive. A publication or slot that is not as
// expected is errConfig, with the line that says what to do: the schema is in log mode, so a
// publication that lost its table means events the slot did not decode, and the engine must
// not confirm past them.
func (e *Engine) setup(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	if len(e.cfg.Destinations) > 0 {
		res, err := conn.Exec(ctx, sqlRowFilters).ReadAll()
		if err != nil {
			return 0, fmt.Errorf("read the server version: %w", err)
		}
		if len(res) == 0 || len(res[0].Rows) == 0 || string(res[0].Rows[0][0]) != "t" {
			return 0, fmt.Errorf("%w: Destinations in log mode need PostgreSQL 15 or later (publication row filters)", errConfig)
		}
	}
	pub, err := e.findPublication(ctx, conn)
	if err != nil {
		return 0, err
	}
	switch v, lost, err := logslot.CheckPublication(pub, e.cfg.Schema, e.cfg.Destinations); v {
	case logslot.Create:
		if _, err := conn.Exec(ctx, logslot.Statement(logslot.SQLCreatePublication, e.cfg.Schema, e.cfg.Publication, e.cfg.Destinations)).ReadAll(); err != nil && !isDuplicate(err) {
			return 0, fmt.Errorf("create publication %s: %w", e.cfg.Publication, err)
		}
	case logslot.Repair:
		if lost {
			return 0, fmt.Errorf("%w: %w", errConfig, logslot.MissedError(err, e.cfg.Slot, e.cfg.Destinations))
		}
		return 0, fmt.Errorf("%w: %w; repair it with `relay mode prepare --log-slot=%s` (or a relay's start)", errConfig, err, e.cfg.Slot)
	case logslot.Refuse:
		return 0, fmt.Errorf("%w: %w", errConfig, err)
	}
	for range 2 {
		slot, err := e.findSlot(ctx, conn)
		if err != nil {
			return 0, err
		}
		if slot != nil {
			if err := logslot.CheckSlot(slot); err != nil {
				return 0, fmt.Errorf("%w: %w", errConfig, err)
			}
			if slot.ActivePID != 0 {
				return 0, &slotActiveError{pid: slot.ActivePID}
			}
			if slot.Confirmed == "" {
				return 0, nil // being created by another session: its consistent point is the start
			}
			lsn, err := pglogrepl.ParseLSN(slot.Confirmed)
			if err != nil {
				return 0, fmt.Errorf("replication slot %s: confirmed_flush_lsn: %w", e.cfg.Slot, err)
			}
			return lsn, nil
		}
		_, err = pglogrepl.CreateReplicationSlot(ctx, conn, e.cfg.Slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication})
		if err != nil && !isDuplicate(err) {
			return 0, fmt.Errorf("create replication slot %s: %w", e.cfg.Slot, err)
		}
		e.log.InfoContext(ctx, "log mode: created replication slot", "slot", e.cfg.Slot)
	}
	return 0, fmt.Errorf("replication slot %s: created but not found", e.cfg.Slot)
}

// findPublication reads the publication (logslot.SQLPublication); nil when it does not exist.
func (e *Engine) findPublication(ctx context.Context, conn *pgconn.PgConn) (*logslot.Publication, error) {
	stmt := logslot.Statement(logslot.SQLPublication, e.cfg.Schema, e.cfg.Publication, e.cfg.Destinations)
	res, err := conn.Exec(ctx, stmt).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("find publication %s: %w", e.cfg.Publication, err)
	}
	if len(res) == 0 || len(res[0].Rows) == 0 {
		return nil, nil
	}
	p, err := logslot.ParsePublication(e.cfg.Publication, texts(res[0].Rows[0]))
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// findSlot reads the slot (logslot.SQLSlot); nil when no slot of its name exists.
func (e *Engine) findSlot(ctx context.Context, conn *pgconn.PgConn) (*logslot.Slot, error) {
	res, err := conn.Exec(ctx, logslot.Statement(logslot.SQLSlot, e.cfg.Schema, e.cfg.Slot, nil)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("find replication slot %s: %w", e.cfg.Slot, err)
	}
	if len(res) == 0 || len(res[0].Rows) == 0 {
		return nil, nil
	}
	s, err := logslot.ParseSlot(e.cfg.Slot, texts(res[0].Rows[0]))
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// texts is a result row's columns as strings.
func texts(row [][]byte) []string {
	out := make([]string, len(row))
	for i, c := range row {
		out[i] = string(c)
	}
	return out
}

// isDuplicate reports PostgreSQL's duplicate_object: another engine created it first.
func isDuplicate(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42710"
}

// stream is a started replication: it decodes transactions, produces their records, and
// reports the window's confirmed position.
type stream struct {
	e         *Engine
	conn      *pgconn.PgConn
	w         *window
	relations map[uint32]*layout
	ours      map[uint32]bool // relation id → is keiro_outbox_log of the schema
	tx        *txn            // the open transaction
	cl        *kgo.Client     // the producer: the engine's, or eo's under exactly once
	lastEnd   pglogrepl.LSN   // the end of the last transaction whose Commit was read
	prefix    string          // the prefix of the schema's logical messages (logmsg.Prefix)

	// flush flushes cl on a goroutine of its own when kicked (flushNow). Under exactly once
	// each producer has its flusher (flushNext is eoNext's), so that a flush of the transaction
	// that is committing never holds back the records of the next.
	flush, flushNext *flusher
	// hold, under exactly once, is closed once the records of the transaction committing have
	// settled; until then the records produced are held (send), nil when nothing holds them.
	hold <-chan struct{}
	held []heldRecord

	// Exactly once (eo nil: at least once). Two producers take turns: eo takes the records
	// while eoNext's transaction commits (committing), so that the stream is read and produced
	// while Kafka commits: the commit, from the flush of its last records to Kafka's answer,
	// runs on a goroutine of its own. A transaction commits only once the one before it did.
	eo          *exactlyonce.Producer
	eoNext      *exactlyonce.Producer
	txnID       string        // eo's first id: the key of the position in the offsets topic
	committing  *kafkaCommit  // the commit under way, nil if none
	skipThrough pglogrepl.LSN // Kafka's position: transactions that end at or before it are skipped
	skip        bool          // the open transaction is skipped
	inKafka     int           // records produced in the open Kafka transaction
	kafkaBegan  time.Time     // when its first record was produced
	sent        pglogrepl.LSN // the last position reported
	headers     []envelope.Header
	// abandon is closed when the session gives up on its records in flight (its end's wait
	// for them ran out): a commit waiting for its records aborts.
	abandon chan struct{}

	cancelPeriod context.CancelFunc
}

// flusher flushes a client whenever it is kicked, on a goroutine of its own: Flush waits for
// every record buffered, and the stream must not.
type flusher struct {
	kick chan struct{}
	done chan struct{}
}

// startFlusher starts cl's flusher, which runs until ctx ends.
func startFlusher(ctx context.Context, cl *kgo.Client) *flusher {
	f := &flusher{kick: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-f.kick:
				_ = cl.Flush(ctx)
			}
		}
	}()
	return f
}

// run streams until ctx ends or a failure.
func (s *stream) run(ctx context.Context) error {
	e := s.e
	s.ours = map[uint32]bool{}
	s.abandon = make(chan struct{})
	flushCtx, stopFlush := context.WithCancel(context.Background())
	s.flush = startFlusher(flushCtx, s.cl)
	if s.eoNext != nil {
		s.flushNext = startFlusher(flushCtx, s.eoNext.Client())
	}
	err := s.loop(ctx)
	// Whatever ended the loop, settle what is in flight before the last report: a record
	// acknowledged now is confirmed now, rather than replayed by the next session.
	s.flushNow()
	wait := e.cfg.ShutdownTimeout
	deadline := time.NewTimer(wait)
	for s.w.inFlight() > 0 {
		s.release()
		select {
		case <-s.w.settled:
			continue
		case <-s.hold:
			continue
		case <-deadline.C:
		}
		break
	}
	deadline.Stop()
	if s.w.inFlight() > 0 {
		close(s.abandon)
	}
	stopFlush()
	for _, f := range []*flusher{s.flush, s.flushNext} {
		if f != nil {
			<-f.done
		}
	}
	if s.eo != nil {
		err = s.endKafka(ctx, err)
	}
	if rerr := s.report(context.Background()); rerr != nil && err == nil && ctx.Err() == nil {
		err = rerr
	}
	return err
}

// endKafka ends the session's Kafka transactions: the commit under way completes (whatever
// err is: it cannot be called back), then the open transaction is committed if the session
// ended cleanly (err nil) between two PostgreSQL transactions with every record acknowledged
// and the commit before it succeeded, aborted otherwise (its PostgreSQL transactions are
// replayed by the next session). It returns the session's error, or the commits'. A fencing
// found on the way is never dropped, whatever ended the session first: it is what tells the
// engine that a newer relay holds the slot (a zombie's connection usually fails at the same
// moment as its commit).
func (s *stream) endKafka(ctx context.Context, err error) error {
	keep := func(kerr error) {
		switch {
		case kerr == nil:
		case err == nil:
			if ctx.Err() == nil || exactlyonce.IsFenced(kerr) {
				err = kerr
			}
		case exactlyonce.IsFenced(kerr) && !exactlyonce.IsFenced(err):
			err = errors.Join(kerr, err)
		}
	}
	keep(s.awaitCommit(ctx))
	s.release() // the records held for it: committed below, or aborted
	if !s.eo.Open() {
		return err
	}
	if err == nil && s.tx == nil && s.w.err() == nil && s.w.inFlight() == 0 {
		cerr := s.commitKafka(context.Background())
		if cerr == nil {
			cerr = s.awaitCommit(ctx)
		}
		keep(cerr)
		return err
	}
	actx, cancel := context.WithTimeout(context.Background(), s.e.cfg.ShutdownTimeout)
	defer cancel()
	if aerr := s.eo.Abort(actx); aerr != nil {
		s.e.log.WarnContext(ctx, "log mode: abort the Kafka transaction", "err", aerr)
		if exactlyonce.IsFenced(aerr) {
			keep(aerr)
		}
	}
	return err
}

// commitDue reports whether the open Kafka transaction (exactly once) may commit now: it
// holds records, and only whole PostgreSQL transactions (no transaction is open).
func (s *stream) commitDue() bool {
	return s.eo != nil && s.tx == nil && s.eo.Open() && !s.e.holdCommits
}

// commitReady reports whether the open Kafka transaction may commit now without waiting: it
// is due, and the one before it completed its commit. While that one commits, the stream goes
// on reading into the open transaction (up to MaxRecords, or a full window).
func (s *stream) commitReady() bool {
	return s.committing == nil && s.commitDue()
}

// kafkaCommit is a Kafka transaction committing (exactly once): the end of the last
// PostgreSQL transaction it holds, when its records have settled, and its outcome once known.
type kafkaCommit struct {
	pos pglogrepl.LSN
	// settled is closed once every record of the transaction has settled (or the commit gave
	// up on them): the next transaction's records, held until then (send), may leave, after
	// them on every partition.
	settled chan struct{}
	done    chan error
}

// commitKafka starts committing the open Kafka transaction, with the position of the last
// PostgreSQL transaction it holds, and turns the stream to the other producer: the stream
// reads and produces the next transaction while this one commits. Its PostgreSQL transactions
// are confirmed once it committed (settleCommit).
//
// A transaction commits only after the one before it did: if that one is still committing
// (this transaction reached MaxRecords, or the window is full), the stream waits for it here,
// and a failure of it ends the session. So what Kafka holds is always a prefix of the stream,
// and its position the end of that prefix.
//
// The position record is staged first, so that it leaves with the transaction's last records in
// one flush rather than in a produce round trip of its own. The rest runs on a goroutine of its
// own (finishKafka), while the stream reads on: the flush, the wait for every record of the
// transaction to settle, its dead letters included (a rejection's transaction is in Kafka's
// position once this commits, so the replay would skip it), and the commit. A record that
// failed leaves the transaction uncommitted: it is aborted, the session ends, and the next one
// replays it.
//
// While it waits for the commit before it (for a broker that is away, the wait lasts up to the
// transaction timeout) the status reports go on, as in the loop, so that the server does not
// end the connection after its wal_sender_timeout.
func (s *stream) commitKafka(ctx context.Context) error {
	if err := s.awaitCommit(ctx); err != nil {
		return err
	}
	s.release() // the commit before settled its records: those held for it leave first
	e := s.e
	pos := s.lastEnd
	rec := exactlyonce.PositionRecord(s.eo.OffsetsTopic(), s.txnID,
		exactlyonce.Position{LSN: uint64(pos), Slot: e.cfg.Slot, At: time.Now()})
	if err := s.eo.Stage(ctx, rec); err != nil {
		return fmt.Errorf("exactly once: %w", err)
	}
	// Not the session's context: a commit cut short leaves its outcome unknown. The broker
	// aborts a transaction past its timeout, so no commit outlives it.
	c := &kafkaCommit{pos: pos, settled: make(chan struct{}), done: make(chan error, 1)}
	p, conn := s.eo, s.conn.Conn()
	// Wake the stream, which may be waiting on the slot: it releases the records held for the
	// commit, or settles the commit, at once.
	wake := func() { _ = conn.SetReadDeadline(time.Now()) }
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), e.cfg.ExactlyOnce.TransactionTimeout)
		c.done <- s.finishKafka(cctx, p, c, wake)
		cancel()
		wake()
	}()
	s.committing = c
	s.eo, s.eoNext = s.eoNext, s.eo
	s.flush, s.flushNext = s.flushNext, s.flush
	s.hold = c.settled
	s.cl = s.eo.Client()
	s.inKafka = 0
	if e.onCommitStarted != nil {
		e.onCommitStarted(pos)
	}
	return nil
}

// finishKafka completes c, the commit of p's transaction, off the stream's goroutine
// (commitKafka): it flushes p's records, waits until every record of the PostgreSQL
// transactions through c.pos has settled (then closes c.settled and wakes the stream, which
// lets the next transaction's records leave), and commits; a record of them that failed aborts
// the transaction instead, and so does a session that gave up on its records (abandon). It
// touches only p and the window: the stream reads on meanwhile.
func (s *stream) finishKafka(ctx context.Context, p *exactlyonce.Producer, c *kafkaCommit, wake func()) error {
	err := s.awaitRecords(ctx, p, c.pos)
	close(c.settled)
	wake()
	if err != nil {
		if aerr := p.Abort(ctx); aerr != nil {
			return errors.Join(err, aerr)
		}
		return err // the transaction is aborted and replayed
	}
	if s.e.beforeKafkaCommit != nil {
		s.e.beforeKafkaCommit(c.pos)
	}
	return p.Commit(ctx, nil)
}

// awaitRecords flushes p's records and waits until every record of the PostgreSQL
// transactions through pos has settled, its dead letter included: a rejection's transaction is
// in Kafka's position once the Kafka transaction commits, so the replay would skip it. It
// returns the failure of one of them, or why the wait ended before.
func (s *stream) awaitRecords(ctx context.Context, p *exactlyonce.Producer, pos pglogrepl.LSN) error {
	// The flushers flush the stream's producer; this transaction's last records (and its
	// position record) leave now.
	_ = p.Client().Flush(ctx)
	for {
		settled, err := s.w.settledThrough(pos)
		switch {
		case err != nil:
			return fmt.Errorf("produce: %w", err)
		case settled:
			return nil
		}
		select {
		case <-s.w.commitSettled:
		case <-s.abandon:
			return errors.New("the session ended before the transaction's records settled")
		case <-ctx.Done():
			return fmt.Errorf("wait for the transaction's records: %w", ctx.Err())
		}
	}
}

// awaitCommit waits for the commit under way, if any, and settles it (settleCommit). The status
// reports go on meanwhile.
func (s *stream) awaitCommit(ctx context.Context) error {
	c := s.committing
	if c == nil {
		return nil
	}
	tick := time.NewTicker(s.e.cfg.StatusInterval)
	defer tick.Stop()
	for {
		select {
		case err := <-c.done:
			return s.settleCommit(err)
		case <-tick.C:
			_ = s.report(ctx) // a connection lost shows at the next read
		}
	}
}

// pollCommit settles the commit under way if it has completed, without waiting.
func (s *stream) pollCommit() error {
	if s.committing == nil {
		return nil
	}
	select {
	case err := <-s.committing.done:
		return s.settleCommit(err)
	default:
		return nil
	}
}

// settleCommit takes the outcome of the commit under way: committed, its PostgreSQL
// transactions are confirmed; failed, the session ends (the transaction after it, open, is
// then aborted).
func (s *stream) settleCommit(err error) error {
	c := s.committing
	s.committing = nil
	if err != nil {
		return fmt.Errorf("exactly once: commit the Kafka transaction through %s: %w", c.pos, err)
	}
	s.w.kafkaCommitted(c.pos)
	if s.e.onKafkaCommit != nil {
		s.e.onKafkaCommit(c.pos)
	}
	return nil
}

// flushNow asks the flusher of the stream's producer to flush, without waiting.
func (s *stream) flushNow() {
	select {
	case s.flush.kick <- struct{}{}:
	default:
	}
}

// errReplicationClosed is report's error on a replication connection that pgconn closed after
// a failure.
var errReplicationClosed = errors.New("send standby status: the replication connection was closed after a failure")

// report sends the window's confirmed position as written, flushed and applied, unless the
// connection was closed after a failure (the next session reports from the slot's position).
func (s *stream) report(ctx context.Context) error {
	pos := s.w.position()
	if s.e.holdReports {
		return nil
	}
	if s.conn.IsClosed() {
		// pgconn closes a connection that failed on a goroutine of its own, which writes a
		// Terminate to it; pglogrepl writes the report to the connection directly, past
		// pgconn's state, and would race with it (and the report could seem to go out).
		return errReplicationClosed
	}
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos}); err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	s.sent = pos
	if s.e.onReport != nil {
		s.e.onReport(pos)
	}
	return nil
}

// loop reads the slot until ctx ends or a failure.
func (s *stream) loop(ctx context.Context) error {
	e := s.e
	next := time.Now().Add(e.cfg.StatusInterval)
	rctx := s.period(ctx, next)
	defer s.endPeriod()
	// A read waits until the next status report through the connection's read deadline, which
	// ctx's end moves to now. Reading with a context instead (ReceiveMessage(rctx)) makes pgconn
	// watch it for every message: three allocations a message, most of the stream's garbage
	// after the records themselves. A deadline that passes is a timeout, which pgconn survives.
	conn := s.conn.Conn()
	stopWatch := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stopWatch()
	var deadline time.Time // the read deadline set
	for {
		if err := s.w.err(); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		s.release()
		if err := s.pollCommit(); err != nil {
			return err
		}
		now := time.Now()
		if !now.Before(next) {
			if err := s.report(ctx); err != nil {
				return err
			}
			next = now.Add(e.cfg.StatusInterval)
			rctx = s.period(ctx, next)
		}
		if s.w.full(e.cfg.MaxInFlightRecords, e.cfg.MaxInFlightBytes) {
			if s.commitDue() {
				// The commit flushes and waits for every record.
				if err := s.commitKafka(ctx); err != nil || ctx.Err() != nil {
					return err
				}
				continue
			}
			// Bounded memory: stop reading until records settle. The status reports go on,
			// so the server does not time the connection out meanwhile.
			s.flushNow()
			select {
			case <-ctx.Done():
				return nil
			case <-s.w.settled:
			case <-s.hold: // the records held leave
			case <-rctx.Done():
			}
			continue
		}
		readBy := next
		if s.commitReady() {
			// A deadline already passed reads only what the connection has buffered: the
			// stream is idle when nothing is, and the Kafka transaction commits at once.
			readBy = now
		}
		if !readBy.Equal(deadline) {
			if err := conn.SetReadDeadline(readBy); err != nil {
				return fmt.Errorf("set the replication connection's read deadline: %w", err)
			}
			deadline = readBy
			if ctx.Err() != nil { // ended before the deadline was set: AfterFunc's was overwritten
				return nil
			}
			// A commit that completed (or settled its records) before the deadline was set had
			// its wake overwritten.
			if s.committing != nil && (len(s.committing.done) > 0 || s.hold != nil && closed(s.hold)) {
				continue
			}
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				deadline = time.Time{} // maybe a commit's wake: set the deadline again
				if err := s.pollCommit(); err != nil {
					return err
				}
				if s.commitReady() {
					if err := s.commitKafka(ctx); err != nil {
						return err
					}
				}
				continue // time to report, or to commit
			}
			return fmt.Errorf("receive replication message: %w", err)
		}
		reply, err := s.message(ctx, msg)
		if err != nil {
			return err
		}
		if reply {
			next = time.Time{}
		}
		if s.commitDue() && s.inKafka >= e.cfg.ExactlyOnce.MaxRecords ||
			s.commitReady() && time.Since(s.kafkaBegan) >= e.cfg.ExactlyOnce.Linger {
			if err := s.commitKafka(ctx); err != nil {
				return err
			}
		}
	}
}

// message handles one message of the replication stream: a keepalive (reporting whether the
// server asked for a status report at once) or the WAL data of a transaction's message.
func (s *stream) message(ctx context.Context, msg pgproto3.BackendMessage) (replyRequested bool, err error) {
	e := s.e
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return false, nil
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return false, fmt.Errorf("parse keepalive: %w", err)
			}
			s.w.keepalive(ka.ServerWALEnd)
			if e.onKeepalive != nil {
				e.onKeepalive(ka.ServerWALEnd)
			}
			return ka.ReplyRequested, nil
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return false, fmt.Errorf("parse XLogData: %w", err)
			}
			return false, s.handle(ctx, xld.WALData)
		}
		return false, nil
	case *pgproto3.ErrorResponse:
		return false, fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(msg))
	default:
		return false, fmt.Errorf("replication: unexpected message %T", msg)
	}
}

// period returns the context of reads until the next status report, at next.
func (s *stream) period(ctx context.Context, next time.Time) context.Context {
	s.endPeriod()
	var rctx context.Context
	rctx, s.cancelPeriod = context.WithDeadline(ctx, next)
	return rctx
}

// endPeriod releases the current period's context.
func (s *stream) endPeriod() {
	if s.cancelPeriod != nil {
		s.cancelPeriod()
	}
}

// handle decodes one pgoutput message. data is the connection's read buffer, valid until the
// next message is read: what outlives the call is copied.
func (s *stream) handle(ctx context.Context, data []byte) error {
	if len(data) > 0 && data[0] == byte(pglogrepl.MessageTypeInsert) {
		return s.insert(ctx, data)
	}
	if len(data) > 0 && data[0] == byte(pglogrepl.MessageTypeMessage) {
		return s.logicalMessage(ctx, data)
	}
	m, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		if m.Namespace != s.e.cfg.Schema || m.RelationName != "keiro_outbox_log" {
			s.ours[m.RelationID] = false
			return nil
		}
		l, err := newLayout(m)
		if err != nil {
			return fmt.Errorf("%w: %w", errConfig, err)
		}
		s.relations[m.RelationID], s.ours[m.RelationID] = l, true
	case *pglogrepl.BeginMessage:
		s.tx = s.w.begin(m.CommitTime, m.FinalLSN)
		// FinalLSN is where the transaction's commit record starts, before its end: a
		// transaction Kafka holds (its end at or before skipThrough) starts before it, and
		// any later one at or after it.
		s.skip = m.FinalLSN < s.skipThrough
	case *pglogrepl.CommitMessage:
		if s.tx == nil {
			return errors.New("replication: commit outside a transaction")
		}
		s.w.commit(s.tx, m.TransactionEndLSN)
		s.lastEnd = m.TransactionEndLSN
		if s.e.onCommit != nil {
			s.e.onCommit(m.TransactionEndLSN)
		}
		s.tx = nil
		s.flushNow()
	}
	return nil
}

// insert decodes an Insert message (pgoutput's 'I', relation id, 'N', the new tuple) of
// keiro_outbox_log and produces its record; an insert into another table of the publication
// is skipped. The tuple is decoded in place (layout.row), not through pglogrepl.Parse, which
// allocates every column twice over: inserts are the stream's volume.
func (s *stream) insert(ctx context.Context, data []byte) error {
	if len(data) < 6 {
		return fmt.Errorf("decode pgoutput message: insert of %d bytes", len(data))
	}
	if s.tx == nil {
		return errors.New("replication: insert outside a transaction")
	}
	if s.skip {
		return nil // in Kafka already (exactly once)
	}
	rel := binary.BigEndian.Uint32(data[1:])
	if data[5] != 'N' {
		return fmt.Errorf("decode pgoutput message: insert into relation %d has tuple type %q, want 'N'", rel, data[5])
	}
	l := s.relations[rel]
	if l == nil {
		if known := s.ours[rel]; known {
			return fmt.Errorf("replication: insert into relation %d before its description", rel)
		}
		return nil // a table of the publication other than ours
	}
	r, err := l.row(data[6:])
	var bad *badRowError
	switch {
	case errors.As(err, &bad):
		r = bad.r
	case err != nil:
		return fmt.Errorf("%w: %w", errConfig, err)
	}
	if len(s.e.cfg.Destinations) > 0 && !slices.Contains(s.e.cfg.Destinations, r.ev.Destination) {
		// Not this engine's: the publication's row filter keeps such rows out, this is
		// its backstop. The transaction is confirmed without it.
		return nil
	}
	if bad != nil {
		// The row, not the stream, is at fault: a replay would meet it again. It is
		// rejected, in flight (of no bytes) until its dead letter is written.
		s.w.add(s.tx, 0, false)
		s.reject(s.tx, 0, &r.ev, kafkaerr.CodeUndecodable, bad, false)
		return nil
	}
	return s.produce(ctx, s.tx, r)
}

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
