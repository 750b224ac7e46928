package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// concurrentTransactionsBackoff spaces the retries of a request the broker answers with
// CONCURRENT_TRANSACTIONS (the previous transaction's markers are still being written).
const concurrentTransactionsBackoff = time.Millisecond

// ErrFenced reports that a newer producer of the same transactional id started: this one
// is a zombie, and nothing it produces can commit any more.
var ErrFenced = errors.New("fenced: another relay took over this transactional id")

// Counters are the transactions of an engine's producers since it started.
type Counters struct {
	committed, aborted, fenced atomic.Int64
}

// Committed, Aborted and Fenced count the transactions committed and aborted, and the times
// a producer found itself fenced.
func (c *Counters) Committed() int64 { return c.committed.Load() }

// Aborted counts the transactions aborted (see Committed).
func (c *Counters) Aborted() int64 { return c.aborted.Load() }

// Fenced counts the times a producer found itself fenced (see Committed).
func (c *Counters) Fenced() int64 { return c.fenced.Load() }

// Producer is an engine's transactional producer: a franz-go client with cfg's transactional
// id, on which the engine produces its records between Begin and Commit (or Abort). One
// transaction is open at a time; the engine must not produce while Commit or Abort runs.
type Producer struct {
	cfg      Config
	cl       *kgo.Client
	counters *Counters
	open     bool
	// failed is the first failure of a record of the open transaction (recordFailures).
	failed atomic.Pointer[error]
}

// recordFailures is the producer's hook on every record that leaves the client: franz-go
// fails the producer id (and so refuses the commit) only for some errors of a transactional
// produce; a record refused for itself (MESSAGE_TOO_LARGE, INVALID_RECORD, …) fails alone, and
// EndTransaction would commit the transaction without it. Kafka's Java producer makes any failed
// send abort the transaction; Commit does the same with what this hook saw.
type recordFailures struct{ p *Producer }

// OnProduceRecordUnbuffered implements kgo.HookProduceRecordUnbuffered.
func (h recordFailures) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if err != nil && h.p.failed.Load() == nil {
		err = fmt.Errorf("record of topic %s: %w", r.Topic, err)
		h.p.failed.CompareAndSwap(nil, &err)
	}
}

// NewProducer builds the producer of cfg (defaulted, its TransactionalID set) from opts, the
// relay's client options, ensures cfg's offsets topic exists, and initializes the
// transactional id: a producer of the id still running is fenced from then on, and the
// transaction it had open is aborted (a commit under way completes first). counters, shared
// by the engine's successive producers, may be nil: cfg.Counters then count.
func NewProducer(ctx context.Context, opts []kgo.Opt, cfg Config, counters *Counters) (*Producer, error) {
	if cfg.TransactionalID == "" {
		return nil, errors.New("exactly once: no transactional id")
	}
	if counters == nil {
		counters = cfg.Counters
	}
	if counters == nil {
		counters = &Counters{}
	}
	p := &Producer{cfg: cfg, counters: counters}
	cl, err := kgo.NewClient(append(slices.Clone(opts),
		kgo.TransactionalID(cfg.TransactionalID),
		kgo.TransactionTimeout(cfg.TransactionTimeout),
		// Before transaction version 2 (KIP-890), a transaction's AddPartitionsToTxn right
		// after the previous commit meets CONCURRENT_TRANSACTIONS until the broker has written
		// that commit's markers, a few milliseconds; franz-go's 20ms default backoff would add
		// about 20ms to every transaction. franz-go raises the backoff itself past a second of
		// retries. (From version 2 the broker retries itself: its
		// add.partitions.to.txn.retry.backoff.ms, docs/operations.md.)
		kgo.ConcurrentTransactionsBackoff(concurrentTransactionsBackoff),
		kgo.WithHooks(recordFailures{p}),
	)...)
	if err != nil {
		return nil, fmt.Errorf("exactly once: build the transactional producer: %w", err)
	}
	if err := EnsureTopic(ctx, cl, cfg.OffsetsTopic); err != nil {
		cl.Close()
		return nil, fmt.Errorf("exactly once: %w", err)
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("exactly once: initialize transactional id %s: %w", cfg.TransactionalID, err)
	}
	p.cl = cl
	return p, nil
}

// Client is the producer's client: produce the transaction's records with it.
func (p *Producer) Client() *kgo.Client { return p.cl }

// TransactionalID is the producer's transactional id.
func (p *Producer) TransactionalID() string { return p.cfg.TransactionalID }

// OffsetsTopic is the topic of the progress records.
func (p *Producer) OffsetsTopic() string { return p.cfg.OffsetsTopic }

// Begin opens a transaction unless one is open.
func (p *Producer) Begin() error {
	if p.open {
		return nil
	}
	if err := p.cl.BeginTransaction(); err != nil {
		return p.classify(fmt.Errorf("begin a transaction: %w", err))
	}
	p.failed.Store(nil) // the records of the transactions before all left the client
	p.open = true
	return nil
}

// Open reports whether a transaction is open.
func (p *Producer) Open() bool { return p.open }

// Commit produces progress (the engine's record for the offsets topic; nil for none) in the
// open transaction, flushes, and commits. When a record of the transaction failed (the error
// then wraps ErrRecordFailed), or the commit fails, it aborts and returns the error: the
// transaction's records are not on the topic for a read_committed reader. A commit whose outcome is unknown (the broker was lost
// as it answered) is aborted by bumping the producer's epoch, which also fences any part of
// it still under way; the error then wraps ErrUnknownOutcome, and the engine must read its
// last progress record back (ReadPosition, ReadClaims) to learn what committed. A producer
// found fenced returns an error wrapping ErrFenced and cannot be used again.
func (p *Producer) Commit(ctx context.Context, progress *kgo.Record) error {
	if !p.open {
		return errors.New("commit: no transaction is open")
	}
	var failed error
	if progress != nil {
		// Not ProduceSync: under kgo.ManualFlushing (the relays' producer options) it would
		// wait for a flush no one makes. The promise runs before Flush returns, and the
		// hook (recordFailures) sees its failure as any record's.
		p.cl.Produce(ctx, progress, nil)
	}
	if err := p.cl.Flush(ctx); err != nil {
		failed = fmt.Errorf("flush the transaction: %w", err)
	}
	// Flush returns once every record of the transaction left the client: the hook saw them all.
	if ferr := p.failed.Load(); ferr != nil && failed == nil {
		failed = fmt.Errorf("%w: %w", ErrRecordFailed, *ferr)
	}
	if failed != nil {
		if aerr := p.Abort(ctx); aerr != nil {
			return errors.Join(failed, aerr)
		}
		return p.classify(failed)
	}
	err := p.cl.EndTransaction(ctx, kgo.TryCommit)
	if err == nil {
		p.open = false
		p.counters.committed.Add(1)
		return nil
	}
	err = p.classify(fmt.Errorf("commit the transaction: %w", err))
	if errors.Is(err, ErrFenced) {
		return err
	}
	unknown := !errors.Is(err, kerr.OperationNotAttempted) && !errors.Is(err, kerr.TransactionAbortable)
	if aerr := p.Abort(ctx); aerr != nil {
		return errors.Join(err, aerr)
	}
	if unknown {
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	return err
}

// Stage produces progress (the engine's record for the offsets topic) into the open
// transaction without flushing: it leaves with the transaction's next flush, beside its records,
// and Commit(ctx, nil) then commits it. Staging it before the engine waits for its records saves
// the commit a produce round trip of its own.
func (p *Producer) Stage(ctx context.Context, progress *kgo.Record) error {
	if !p.open {
		return errors.New("stage progress: no transaction is open")
	}
	// Not ProduceSync (see Commit); a failure shows through recordFailures at the commit.
	p.cl.Produce(ctx, progress, nil)
	return nil
}

// ErrRecordFailed reports a transaction that Commit aborted because one of its records failed.
var ErrRecordFailed = errors.New("a record of the transaction failed")

// ErrUnknownOutcome reports a commit that may or may not have taken effect.
var ErrUnknownOutcome = errors.New("the transaction's outcome is unknown")

// Abort drops the records not yet sent and aborts the open transaction (none open: nothing).
func (p *Producer) Abort(ctx context.Context) error {
	if !p.open {
		return nil
	}
	if err := p.cl.AbortBufferedRecords(ctx); err != nil {
		return p.classify(fmt.Errorf("abort the buffered records: %w", err))
	}
	if err := p.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		return p.classify(fmt.Errorf("abort the transaction: %w", err))
	}
	p.open = false
	p.counters.aborted.Add(1)
	return nil
}

// Close aborts an open transaction (bounded by ctx) and closes the client.
func (p *Producer) Close(ctx context.Context) {
	_ = p.Abort(ctx)
	p.cl.Close()
}

// classify marks err with ErrFenced when Kafka says a newer producer of the id started, and
// counts it.
func (p *Producer) classify(err error) error {
	if IsFenced(err) {
		p.open = false
		p.counters.fenced.Add(1)
		return fmt.Errorf("%w (transactional id %s): %w", ErrFenced, p.cfg.TransactionalID, err)
	}
	return err
}

// IsFenced reports whether err says a newer producer of the transactional id started.
func IsFenced(err error) bool {
	return errors.Is(err, ErrFenced) || errors.Is(err, kerr.ProducerFenced) ||
		errors.Is(err, kerr.InvalidProducerEpoch)
}
