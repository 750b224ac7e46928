package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
)

// committedReader reads topics from their start in the background as a read_committed
// consumer: aborted records never reach it. It keeps the control records (the commit and
// abort markers, which occupy offsets) to know how far it read, so that it can tell when it
// reached the end offsets.
type committedReader struct {
	cl     *kgo.Client
	topics []string
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	recs   []*kgo.Record              // data records, in fetch order (offset order per partition)
	next   map[string]map[int32]int64 // next offset to read, by topic and partition
	copies map[string]int             // message id → records read
}

// startCommittedReader starts reading topics (which exist) on the brokers at seeds; it stops
// when t ends.
func startCommittedReader(t *testing.T, seeds []string, topics ...string) *committedReader {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &committedReader{cl: cl, topics: topics, cancel: cancel, done: make(chan struct{}),
		next: map[string]map[int32]int64{}, copies: map[string]int{}}
	go func() {
		defer close(r.done)
		for {
			// Fetch errors (a broker killed, a leader moving) are retried by the client.
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			fs.EachRecord(r.add)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(r.close)
	return r
}

func (r *committedReader) close() {
	r.cancel()
	<-r.done
	r.cl.Close()
}

// add records rec (r.mu held).
func (r *committedReader) add(rec *kgo.Record) {
	if r.next[rec.Topic] == nil {
		r.next[rec.Topic] = map[int32]int64{}
	}
	r.next[rec.Topic][rec.Partition] = rec.Offset + 1
	if rec.Attrs.IsControl() {
		return
	}
	r.recs = append(r.recs, rec)
	r.copies[messageID(rec)]++
}

// distinct is the number of distinct message ids read so far.
func (r *committedReader) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.copies)
}

// records is the number of data records read so far (duplicates included).
func (r *committedReader) records() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// snapshot returns the data records read so far.
func (r *committedReader) snapshot() []*kgo.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*kgo.Record(nil), r.recs...)
}

// caughtUp reports whether the reader read every partition of its topics up to the high
// watermark as adm lists it now: then no transaction was open on them (a read_committed
// fetch stops at the last stable offset), and every record below it was read.
func (r *committedReader) caughtUp(ctx context.Context, adm *kadm.Client) bool {
	ends, err := adm.ListEndOffsets(ctx, r.topics...)
	if err != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ok := true
	ends.Each(func(l kadm.ListedOffset) {
		if l.Err != nil || (l.Offset > 0 && r.next[l.Topic][l.Partition] < l.Offset) {
			ok = false
		}
	})
	return ok
}

// committedPast reports whether group committed, on every partition of topic, an offset past
// the last data record the reader read there (a transaction's commit marker may follow it:
// a consumer commits the offset after the last record it handled, not after the marker).
// Meaningful once the reader caught up (caughtUp) and nothing more is produced.
func (r *committedReader) committedPast(ctx context.Context, adm *kadm.Client, group, topic string) bool {
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return false
	}
	r.mu.Lock()
	last := map[int32]int64{}
	for _, rec := range r.recs {
		if rec.Topic == topic {
			last[rec.Partition] = max(last[rec.Partition], rec.Offset+1)
		}
	}
	r.mu.Unlock()
	for p, end := range last {
		c, found := offs.Lookup(topic, p)
		if !found || c.At < end {
			return false
		}
	}
	return true
}

// waitCaughtUp waits until the reader reached the end offsets (caughtUp).
func (r *committedReader) waitCaughtUp(t *testing.T, adm *kadm.Client, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !r.caughtUp(context.Background(), adm) {
		if time.Now().After(deadline) {
			t.Fatalf("the read_committed reader did not reach the end offsets of %v within %s: %s",
				r.topics, timeout, r.positions(adm))
		}
		time.Sleep(100 * time.Millisecond) // polling the broker: the tick only bounds the rate
	}
}

// positions describes, per partition, the reader's position, the last stable offset and the
// high watermark, for a failure message.
func (r *committedReader) positions(adm *kadm.Client) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, r.topics...)
	if err != nil {
		return err.Error()
	}
	stable, err := adm.ListCommittedOffsets(ctx, r.topics...)
	if err != nil {
		return err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	ends.Each(func(l kadm.ListedOffset) {
		lso, _ := stable.Lookup(l.Topic, l.Partition)
		fmt.Fprintf(&b, "\n  %s[%d]: read up to %d, last stable offset %d, high watermark %d",
			l.Topic, l.Partition, r.next[l.Topic][l.Partition], lso.Offset, l.Offset)
	})
	return b.String()
}

// openTransaction reports whether a transaction with records is open on one of topic's
// partitions: its last stable offset is below its high watermark.
func openTransaction(ctx context.Context, adm *kadm.Client, topic string) bool {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return false
	}
	stable, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return false
	}
	open := false
	ends.Each(func(l kadm.ListedOffset) {
		if s, ok := stable.Lookup(l.Topic, l.Partition); ok && s.Err == nil && l.Err == nil && s.Offset < l.Offset {
			open = true
		}
	})
	return open
}

// messageID is the keiro message id header of rec ("" if absent).
func messageID(rec *kgo.Record) string {
	for _, h := range rec.Headers {
		if h.Key == envelope.HeaderMessageID {
			return string(h.Value)
		}
	}
	return ""
}

// committedRecord is one record as a reader saw it, for the exactly-once checks.
type committedRecord struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	Value     string
	ID        string
}

func fromKgo(recs []*kgo.Record) []committedRecord {
	out := make([]committedRecord, 0, len(recs))
	for _, r := range recs {
		out = append(out, committedRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Key: string(r.Key), Value: string(r.Value), ID: messageID(r)})
	}
	return out
}

// exactlyOnceViolations checks recs (every committed record of one topic, in offset order per
// partition) against want (key → events enqueued, numbered 1, 2, 3, … by keyedEvent): each
// message id once, and each key's events in the key's partition in order 1, 2, …, want[key].
// It returns at most a few dozen problems.
func exactlyOnceViolations(recs []committedRecord, want map[string]int64) []string {
	var out []string
	add := func(format string, args ...any) {
		if len(out) < 40 {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	sorted := append([]committedRecord(nil), recs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].Partition != sorted[j].Partition {
			return sorted[i].Partition < sorted[j].Partition
		}
		return sorted[i].Offset < sorted[j].Offset
	})
	copies := map[string]int{}
	seqs := map[string][]int64{}
	for _, r := range sorted {
		copies[r.ID]++
		if copies[r.ID] == 2 {
			add("message %s read twice (second copy at partition %d offset %d)", r.ID, r.Partition, r.Offset)
		}
		var seq int64
		if _, err := fmt.Sscanf(r.Value, `{"seq":%d}`, &seq); err != nil {
			add("undecodable payload %q at partition %d offset %d", r.Value, r.Partition, r.Offset)
			continue
		}
		if want := fmt.Sprintf("%s-%06d", r.Key, seq); r.ID != want {
			add("record of key %s seq %d has message id %q", r.Key, seq, r.ID)
		}
		seqs[r.Key] = append(seqs[r.Key], seq)
	}
	for k, n := range want {
		got := seqs[k]
		if int64(len(got)) != n {
			add("%s: %d records, %d events enqueued", k, len(got), n)
			continue
		}
		for i, s := range got {
			if s != int64(i+1) {
				add("%s: seq %d at position %d", k, s, i+1)
				break
			}
		}
	}
	for k := range seqs {
		if _, ok := want[k]; !ok {
			add("%s: records of a key never enqueued", k)
		}
	}
	return out
}

// requirePython fails t unless Debian's python3 can import librdkafka's binding.
func requirePython(t *testing.T) {
	t.Helper()
	out, err := exec.Command(debianPython, "-c", "import confluent_kafka").CombinedOutput()
	require.NoError(t, err, "python3-confluent-kafka is required for %s (apt-get install python3-confluent-kafka): %s", debianPython, out)
}

// pythonCommitted reads every committed record of topic with librdkafka's Python binding
// (isolation.level=read_committed), up to the high watermarks as they stand when it starts.
func pythonCommitted(t *testing.T, seeds []string, topic string) []committedRecord {
	t.Helper()
	script := filepath.Join("testdata", "interop.py")
	cmd := exec.Command(debianPython, script, "consume-committed", strings.Join(seeds, ","), topic)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "interop.py consume-committed: %s", stderr.String())
	var recs []committedRecord
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var j struct {
			Key, Value string
			Headers    [][2]string
			Partition  int32
			Offset     int64
		}
		require.NoError(t, json.Unmarshal(line, &j), "python line %s", line)
		r := committedRecord{Topic: topic, Partition: j.Partition, Offset: j.Offset, Key: j.Key, Value: j.Value}
		for _, h := range j.Headers {
			if h[0] == envelope.HeaderMessageID {
				r.ID = h[1]
			}
		}
		recs = append(recs, r)
	}
	return recs
}

// samePositions lists the records that two readers of the same topic placed differently (by
// message id: partition and offset), at most a few dozen.
func samePositions(a, b []committedRecord) []string {
	at := map[string]string{}
	for _, r := range a {
		at[r.ID] = fmt.Sprintf("%d@%d", r.Partition, r.Offset)
	}
	var out []string
	for _, r := range b {
		if p := fmt.Sprintf("%d@%d", r.Partition, r.Offset); at[r.ID] != p && len(out) < 40 {
			out = append(out, fmt.Sprintf("%s: %s vs %s", r.ID, at[r.ID], p))
		}
	}
	return out
}
