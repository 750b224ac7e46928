// Package exactlyonce is what both relay engines share to publish exactly once: the
// transactional ids, the offsets topic and its records, the fence of a transactional id, and
// the reads of what a fenced producer committed last.
//
// As Kafka Connect's exactly-once source connectors do (KIP-618), a relay publishes each batch
// in a Kafka transaction that also carries a record of its progress to the offsets topic:
//
//   - the log engine, the slot's position (key "log/<transactional id>", value the end LSN of
//     the last PostgreSQL transaction the Kafka transaction holds whole). On start it fences its
//     transactional id and resumes past the position Kafka holds, even when the slot's
//     confirmed position lags behind it;
//   - the claim engine, the claims whose records a transaction commits and whose rows are not
//     yet marked sent (key "claim/<transactional id>", value their claim tokens). A relay that
//     takes over a lost claim fences the transactional id the claim's rows name, reads that id's
//     last committed record, and marks the claims it lists sent instead of publishing them again.
//
// The offsets topic is compacted and has one partition: it holds one record per key, the last.
// Each value is a small JSON document.
package exactlyonce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultOffsetsTopic is the offsets topic's default name.
const DefaultOffsetsTopic = "keiro-relay-offsets"

// DefaultTransactionTimeout is the relays' Kafka transaction timeout: a transaction its relay
// neither committed nor aborted within it (the relay froze or died) is aborted by the broker.
const DefaultTransactionTimeout = 60 * time.Second

// DefaultLinger is how long a relay's Kafka transaction stays open for more records before
// it commits when records keep coming; an idle relay commits at once.
const DefaultLinger = 10 * time.Millisecond

// DefaultMaxRecords is the most records one Kafka transaction of a relay holds.
const DefaultMaxRecords = 8192

// Config is how a relay engine publishes exactly once; a nil *Config publishes at least once.
type Config struct {
	// OffsetsTopic is the compacted topic of the transactions' progress records. Defaults
	// to DefaultOffsetsTopic.
	OffsetsTopic string
	// TransactionalID is the engine's transactional id: the log engine's is derived from
	// its slot (LogTransactionalID) and set by the engine; the claim engine's is
	// ClaimTransactionalID of its instance.
	TransactionalID string
	// TransactionTimeout is the Kafka transaction timeout. Defaults to
	// DefaultTransactionTimeout.
	TransactionTimeout time.Duration
	// Linger is how long a transaction stays open for more records. Defaults to DefaultLinger.
	Linger time.Duration
	// MaxRecords is the most records one transaction holds. Defaults to DefaultMaxRecords.
	MaxRecords int
	// Counters count the transactions of every producer built from the configuration (the
	// relay's metrics read them). Defaults to new counters.
	Counters *Counters
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.OffsetsTopic == "" {
		c.OffsetsTopic = DefaultOffsetsTopic
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.MaxRecords == 0 {
		c.MaxRecords = DefaultMaxRecords
	}
	if c.Counters == nil {
		c.Counters = &Counters{}
	}
	return c
}

// LogTransactionalID is the transactional id of the log engine following slot on the database
// whose system identifier (IDENTIFY_SYSTEM's systemid) and name are given: unique per slot
// across every database that shares a Kafka cluster, and the same for every relay of the slot,
// so that the one that takes over the slot fences the one before.
func LogTransactionalID(systemID, database, slot string) string {
	return "keiro-relay-log." + systemID + "." + database + "." + slot
}

// LogPipelineID is the log engine's second transactional id, of the producer that takes the
// next transaction while the first commits (its id is txnID, a LogTransactionalID): the two
// take turns. A slot name has no dot, so no slot's id is another's second.
func LogPipelineID(txnID string) string { return txnID + ".1" }

// ClaimTransactionalID is the transactional id of a claim relay of schema, instance naming
// the relay (unique among the relays of the schema: a random one by default).
func ClaimTransactionalID(schema, instance string) string {
	return "keiro-relay-claim." + schema + "." + instance
}

// PositionKey and ClaimsKey are the offsets topic's keys of a transactional id's records.
func PositionKey(txnID string) string { return "log/" + txnID }

// ClaimsKey is the offsets topic's key of a claim relay's record (see PositionKey).
func ClaimsKey(txnID string) string { return "claim/" + txnID }

// Position is the log engine's record: every PostgreSQL transaction whose commit ends at or
// before LSN is committed to Kafka.
type Position struct {
	// LSN is the end LSN of the last PostgreSQL transaction committed to Kafka, as a number.
	LSN uint64 `json:"lsn"`
	// Slot is the replication slot, for the reader's eyes.
	Slot string `json:"slot"`
	// At is when the transaction was committed, for the reader's eyes.
	At time.Time `json:"at"`
}

// Claims is the claim engine's record: the claims whose records the transaction that wrote it
// (or an earlier one of the same transactional id) committed, and whose marks had not all
// landed when it was written.
type Claims struct {
	// Tokens are the claims' tokens.
	Tokens []string `json:"tokens"`
	// Rows are, per claim token, the seqs of the claim's rows whose records the transactions
	// hold: a claim's rows are not all published (one rejected before its produce, one whose
	// lease ran out, a stop between two flushes), and a row not listed is published again.
	Rows map[string][]int64 `json:"rows,omitempty"`
	// At is when the transaction was committed, for the reader's eyes.
	At time.Time `json:"at"`
}

// PositionRecord is the record of p for topic, under txnID's key.
func PositionRecord(topic, txnID string, p Position) *kgo.Record {
	v, _ := json.Marshal(p) // a struct of plain fields: cannot fail
	return &kgo.Record{Topic: topic, Partition: 0, Key: []byte(PositionKey(txnID)), Value: v}
}

// ClaimsRecord is the record of c for topic, under txnID's key.
func ClaimsRecord(topic, txnID string, c Claims) *kgo.Record {
	if c.Tokens == nil {
		c.Tokens = []string{}
	}
	v, _ := json.Marshal(c)
	return &kgo.Record{Topic: topic, Partition: 0, Key: []byte(ClaimsKey(txnID)), Value: v}
}

// Fence makes txnID's earlier producers unable to produce or commit: it initializes a producer
// id for txnID (InitProducerID), which bumps the id's epoch and aborts the transaction it had
// open. A commit already under way completes first. opts are the relay's client options.
func Fence(ctx context.Context, opts []kgo.Opt, txnID string) error {
	cl, err := kgo.NewClient(append(opts, kgo.TransactionalID(txnID))...)
	if err != nil {
		return fmt.Errorf("fence transactional id %s: %w", txnID, err)
	}
	defer cl.Close()
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("fence transactional id %s: %w", txnID, err)
	}
	return nil
}

// ErrNoRecord reports that the offsets topic holds no committed record under a key.
var ErrNoRecord = errors.New("no committed record in the offsets topic")

// ReadPosition reads txnID's last committed Position from topic. Fence txnID first: what an
// earlier producer of it had open is then aborted, and nothing after it can commit.
func ReadPosition(ctx context.Context, opts []kgo.Opt, topic, txnID string) (Position, error) {
	var p Position
	v, err := readLast(ctx, opts, topic, PositionKey(txnID))
	if err != nil {
		return p, err
	}
	if err := decodeProgress(v, "lsn", &p); err != nil {
		return p, fmt.Errorf("offsets topic %s: the record of %s is not a position: %w", topic, PositionKey(txnID), err)
	}
	return p, nil
}

// ReadClaims reads txnID's last committed Claims from topic. Fence txnID first (ReadPosition).
func ReadClaims(ctx context.Context, opts []kgo.Opt, topic, txnID string) (Claims, error) {
	var c Claims
	v, err := readLast(ctx, opts, topic, ClaimsKey(txnID))
	if err != nil {
		return c, err
	}
	if err := decodeProgress(v, "tokens", &c); err != nil {
		return c, fmt.Errorf("offsets topic %s: the record of %s is not a claims record: %w", topic, ClaimsKey(txnID), err)
	}
	return c, nil
}

// decodeProgress decodes v, a progress record's value, into into: a JSON object that has the
// field required. A value that decodes without it (null, {}, another tool's object) would
// otherwise read as a position of zero or no claims, which is not what its writer meant.
func decodeProgress(v []byte, required string, into any) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(v, &fields); err != nil {
		return err
	}
	if f, ok := fields[required]; !ok || string(f) == "null" {
		return fmt.Errorf("no %q field", required)
	}
	return json.Unmarshal(v, into)
}

// readLast returns the value of key's last committed record in topic's partition 0, reading
// (read_committed) from the start up to the end offset as it stands when the read starts; a
// transaction another producer holds open delays the read until it ends (at most the
// transaction timeout). ErrNoRecord if key has none, or if its last is a tombstone.
func readLast(ctx context.Context, opts []kgo.Opt, topic, key string) ([]byte, error) {
	admin, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("offsets topic %s: %w", topic, err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("offsets topic %s: list end offsets: %w", topic, err)
	}
	end, ok := ends.Lookup(topic, 0)
	if !ok {
		return nil, fmt.Errorf("offsets topic %s: no partition 0", topic)
	}
	if end.Err != nil {
		return nil, fmt.Errorf("offsets topic %s: end offset: %w", topic, end.Err)
	}
	if end.Offset == 0 {
		return nil, ErrNoRecord
	}
	cl, err := kgo.NewClient(append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(500*time.Millisecond),
	)...)
	if err != nil {
		return nil, fmt.Errorf("offsets topic %s: %w", topic, err)
	}
	defer cl.Close()
	var last []byte
	found := false
	// Control records (the commit and abort markers) are kept: every transaction ends with
	// one, so the offsets returned reach the end offset even when the last records before
	// it were aborted. A read_committed fetch waits at the last stable offset while a
	// transaction is open.
	for next := int64(0); next < end.Offset; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("offsets topic %s: %w", topic, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return nil, fmt.Errorf("offsets topic %s: fetch: %w", topic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() && string(r.Key) == key {
				// A tombstone (a null value) deletes the key's record: an operator's reset.
				last, found = r.Value, r.Value != nil
			}
			next = r.Offset + 1
		})
	}
	if !found {
		return nil, ErrNoRecord
	}
	return last, nil
}

// EnsureTopic creates the offsets topic if it does not exist: one partition, compacted, with
// the cluster's default replication factor (at most 3, at least the brokers' number). An
// existing topic must be compacted and of one partition.
func EnsureTopic(ctx context.Context, cl *kgo.Client, topic string) error {
	adm := kadm.NewClient(cl)
	details, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("offsets topic %s: %w", topic, err)
	}
	if d, ok := details[topic]; ok && d.Err == nil {
		if n := len(d.Partitions); n != 1 {
			return fmt.Errorf("offsets topic %s has %d partitions; it must have one", topic, n)
		}
		cfgs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			return fmt.Errorf("offsets topic %s: describe its configuration: %w", topic, err)
		}
		rc, err := cfgs.On(topic, nil)
		if err != nil {
			return fmt.Errorf("offsets topic %s: describe its configuration: %w", topic, err)
		}
		for _, c := range rc.Configs {
			if c.Key == "cleanup.policy" && c.Value != nil && *c.Value != "compact" {
				return fmt.Errorf("offsets topic %s has cleanup.policy=%s; it must be compact", topic, *c.Value)
			}
		}
		return nil
	}
	brokers, err := adm.ListBrokers(ctx)
	if err != nil {
		return fmt.Errorf("offsets topic %s: list brokers: %w", topic, err)
	}
	rf := int16(min(3, len(brokers)))
	compact := "compact"
	resp, err := adm.CreateTopic(ctx, 1, rf, map[string]*string{"cleanup.policy": &compact}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("offsets topic %s: create it (1 partition, replication factor %d, compacted): %w", topic, rf, err)
	}
	return nil
}
