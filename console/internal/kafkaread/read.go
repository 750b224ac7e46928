// Package kafkaread reads records of a partition between two offsets with plain Fetch
// requests through an existing client: it joins no group, assigns no partitions and leaves the
// client's own consuming (if any) alone, so that a console can read a dead-letter topic
// through the client it reads the lag with.
package kafkaread

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrNoPartition reports a topic or partition the cluster does not have.
var ErrNoPartition = errors.New("no such topic or partition")

// fetchBytes bounds one Fetch answer by default (Kafka returns at least one batch even when it
// is larger).
const fetchBytes = 4 << 20

// ErrBudget reports a Range that stopped because its answers reached Options.MaxTotalBytes
// before the end of the range: the records it returns are the oldest of the range only.
var ErrBudget = errors.New("the read reached its byte budget")

// Options bound a Range.
type Options struct {
	// MaxBytes bounds each Fetch answer; Kafka still returns a first record batch larger than
	// it. 1 reads one batch per Fetch. Defaults to 4 MiB.
	MaxBytes int32
	// MaxTotalBytes, when positive, stops the Range with ErrBudget once its answers hold this
	// many bytes of record batches and the range is not read to its end.
	MaxTotalBytes int
	// Fetched, when set, is told the bytes of record batches of each Fetch answer.
	Fetched func(bytes int)
}

// Bounds are a partition's log start and end offsets.
type Bounds struct {
	// Start is the first offset still in the log.
	Start int64
	// End is the log end offset (the next record's offset).
	End int64
	// Err is the partition's listing error, if any.
	Err error
}

// Partitions lists the partitions of topics with their log start and end offsets. A topic that
// does not exist is reported in the map under its name with a single entry for partition -1
// holding the error.
func Partitions(ctx context.Context, cl *kgo.Client, topics ...string) (map[string]map[int32]Bounds, error) {
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("list the start offsets of %v: %w", topics, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("list the end offsets of %v: %w", topics, err)
	}
	out := map[string]map[int32]Bounds{}
	for _, t := range topics {
		out[t] = map[int32]Bounds{}
		ps, ok := ends[t]
		if !ok || len(ps) == 0 {
			out[t][-1] = Bounds{Err: kerr.UnknownTopicOrPartition}
			continue
		}
		for p, e := range ps {
			b := Bounds{End: e.Offset, Err: e.Err}
			if s, ok := starts.Lookup(t, p); ok {
				b.Start = s.Offset
				if b.Err == nil {
					b.Err = s.Err
				}
			}
			out[t][p] = b
		}
	}
	return out, nil
}

// Range returns the committed records of topic's partition with offsets in [from, to), oldest
// first. Offsets missing from the log (compacted, aborted, control records, before its start or
// past its end) are skipped.
func Range(ctx context.Context, cl *kgo.Client, topic string, partition int32, from, to int64, opts Options) ([]*kgo.Record, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = fetchBytes
	}
	if from >= to {
		return nil, nil
	}
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("read the metadata of %s: %w", topic, err)
	}
	td, ok := md.Topics[topic]
	if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("topic %s: %w", topic, ErrNoPartition)
	}
	if td.Err != nil {
		return nil, fmt.Errorf("topic %s: %w", topic, td.Err)
	}
	pd, ok := td.Partitions[partition]
	if !ok {
		return nil, fmt.Errorf("topic %s partition %d: %w", topic, partition, ErrNoPartition)
	}
	if pd.Err != nil {
		return nil, fmt.Errorf("topic %s partition %d: %w", topic, partition, pd.Err)
	}
	var out []*kgo.Record
	spent := 0
	for from < to {
		if opts.MaxTotalBytes > 0 && spent >= opts.MaxTotalBytes {
			return out, fmt.Errorf("read %s partition %d from %d: %w", topic, partition, from, ErrBudget)
		}
		recs, next, n, err := fetch(ctx, cl, td, pd.Leader, partition, from, opts.MaxBytes)
		spent += n
		if opts.Fetched != nil && n > 0 {
			opts.Fetched(n)
		}
		if err != nil {
			return out, err
		}
		for _, r := range recs {
			if r.Offset >= to {
				return out, nil
			}
			out = append(out, r)
		}
		if next <= from {
			return out, nil // nothing more readable (the last stable offset is before to)
		}
		from = next
	}
	return out, nil
}

// fetch sends one Fetch for partition at offset to its leader, its answer bounded by maxBytes;
// next is the offset after the last one the answer covered, n the bytes of its record batches.
func fetch(ctx context.Context, cl *kgo.Client, td kadm.TopicDetail, leader, partition int32, offset int64, maxBytes int32) (recs []*kgo.Record, next int64, n int, err error) {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 100
	req.MinBytes = 1
	req.MaxBytes = maxBytes
	req.IsolationLevel = 1
	req.SessionEpoch = -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = td.Topic, td.ID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = partition, offset, maxBytes
	rp.CurrentLeaderEpoch, rp.LogStartOffset = -1, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl.Broker(int(leader)))
	if err != nil {
		return nil, offset, 0, fmt.Errorf("fetch %s partition %d at %d: %w", td.Topic, partition, offset, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, offset, 0, fmt.Errorf("fetch %s partition %d at %d: %w", td.Topic, partition, offset, err)
	}
	for i := range resp.Topics {
		for j := range resp.Topics[i].Partitions {
			p := &resp.Topics[i].Partitions[j]
			if p.Partition != partition {
				continue
			}
			n := len(p.RecordBatches)
			fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
				Offset: offset, Topic: td.Topic, Partition: partition, IsolationLevel: kgo.ReadCommitted(),
			}, p, kgo.DefaultDecompressor(), nil)
			if errors.Is(fp.Err, kerr.OffsetOutOfRange) {
				return nil, offset, n, nil // before the log start or past its end: no record there
			}
			if fp.Err != nil {
				return nil, offset, n, fmt.Errorf("fetch %s partition %d at %d: %w", td.Topic, partition, offset, fp.Err)
			}
			// ProcessFetchPartition answers the offset after the last one it processed.
			return fp.Records, max(next, offset), n, nil
		}
	}
	return nil, offset, 0, fmt.Errorf("fetch %s partition %d at %d: the broker's answer has no such partition", td.Topic, partition, offset)
}
