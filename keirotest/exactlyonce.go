package keirotest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// ExactlyOnce describes what RequireExactlyOnce expects of a topic.
type ExactlyOnce struct {
	// MessageIDs are the identities (ID) that must each be on the topic exactly once, in the
	// order records of one key must appear in: two ids whose records share a Kafka key must be
	// found in the order they have here. Records of other ids fail the assertion. An empty
	// list wants a topic without committed records. Defaults to none.
	MessageIDs []string
	// ID is a record's identity, the value compared with MessageIDs; "" says the record is
	// not one of the test's (it is then reported as unexpected). Use it when the identity
	// travels elsewhere than in the message id, such as a forwarded event's causing message.
	// Defaults to the decoded event's message id (keiro-message-id), "" for a record that is
	// not a keiro record.
	ID func(Record) string
	// AllowDuplicates accepts copies of a wanted record, for a topic written at least once
	// (a relay that does not publish in Kafka transactions repeats the records it had in
	// flight when it died): every id must still be there, nothing else, and each key's first
	// copies in order. Defaults to false: a second copy fails the assertion.
	AllowDuplicates bool
	// Within is how long to wait for the topic to hold what is wanted (for a relay running in
	// the background). Defaults to 0: only the records on the topic when RequireExactlyOnce is
	// called count.
	Within time.Duration
}

// Committed is what CommittedRecords read from a topic.
type Committed struct {
	// Records are the committed records, in partition and offset order, keiro envelopes
	// decoded: records of producers that use no transactions and records of committed
	// transactions.
	Records []Record
	// Aborted counts the records of aborted transactions that were left out.
	Aborted int
	// Open counts the records of transactions still open (neither committed nor aborted
	// before the end offset) that were left out.
	Open int
}

// CommittedRecords returns what a read_committed consumer reading topic from its start would
// be given, up to each partition's end offset at the time of the call: the records of
// transactions that committed and of producers that use no transactions, never those of an
// aborted transaction or of one still open. Transaction markers (control records) are not
// records a consumer is given and are left out too. A topic that does not exist has none.
//
// Unlike a read_committed client, which stops at the first record of an open transaction (the
// last stable offset), CommittedRecords reads up to the end: records committed after an open
// transaction began are included, the open transaction's records counted in Committed.Open.
func CommittedRecords(t testing.TB, kafka *Kafka, topic string) Committed {
	t.Helper()
	if kafka == nil {
		t.Fatalf("keirotest.CommittedRecords: kafka is nil; pass the broker from keirotest.NewKafka")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := readCommitted(ctx, kafka, topic)
	if err != nil {
		t.Fatalf("keirotest.CommittedRecords: read topic %q: %v", topic, err)
	}
	return c
}

// RequireExactlyOnce fails t unless the committed records of topic (CommittedRecords: records
// of aborted transactions do not count) hold each of want.MessageIDs exactly once (at least
// once with want.AllowDuplicates), nothing else, and the records of each Kafka key in the order
// want.MessageIDs lists their ids. It returns the records. The failure message lists every duplicated id with the offsets of its copies,
// every missing id, every record that was not wanted, and every pair of one key's records
// found in the wrong order. Records without a key are not ordered.
//
//	keirotest.RequireExactlyOnce(t, kafka, "billing.invoices.v1", keirotest.ExactlyOnce{
//		MessageIDs: ids, Within: 30 * time.Second,
//	})
func RequireExactlyOnce(t testing.TB, kafka *Kafka, topic string, want ExactlyOnce) []Record {
	t.Helper()
	const who = "keirotest.RequireExactlyOnce"
	if kafka == nil {
		t.Fatalf("%s: kafka is nil; pass the broker from keirotest.NewKafka", who)
	}
	if want.Within < 0 {
		t.Fatalf("%s: ExactlyOnce.Within must not be negative, got %s", who, want.Within)
	}
	index := make(map[string]int, len(want.MessageIDs))
	for i, id := range want.MessageIDs {
		if id == "" {
			t.Fatalf("%s: ExactlyOnce.MessageIDs[%d] is empty", who, i)
		}
		if j, ok := index[id]; ok {
			t.Fatalf("%s: ExactlyOnce.MessageIDs lists %q twice (at %d and %d)", who, id, j, i)
		}
		index[id] = i
	}
	id := want.ID
	if id == nil {
		id = func(r Record) string { return r.Event.MessageID }
	}
	deadline := time.Now().Add(want.Within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := readCommitted(ctx, kafka, topic)
		cancel()
		if err != nil {
			t.Fatalf("%s: read topic %q: %v", who, topic, err)
		}
		report := checkExactlyOnce(c.Records, want.MessageIDs, index, id, want.AllowDuplicates)
		if report == "" {
			return c.Records
		}
		if time.Now().Before(deadline) {
			time.Sleep(min(50*time.Millisecond, time.Until(deadline))) // Kafka offers no signal for "a record arrived"
			continue
		}
		once := "exactly once"
		if want.AllowDuplicates {
			once = "at least once"
		}
		head := fmt.Sprintf("topic %q does not hold each of %s %s in key order", topic, plural(len(want.MessageIDs), "message id"), once)
		if want.Within > 0 {
			head += fmt.Sprintf(" within %s", want.Within)
		}
		t.Fatalf("%s: %s\n  read %s (left out: %s of aborted transactions, %s of open ones)%s",
			who, head, plural(len(c.Records), "committed record"), plural(c.Aborted, "record"), plural(c.Open, "record"), report)
		return nil
	}
}

// checkExactlyOnce returns what is wrong with recs against the wanted ids (index: id → its
// place in want), one section per kind of problem, or "" when nothing is. Copies are a problem
// unless allowDuplicates is set.
func checkExactlyOnce(recs []Record, want []string, index map[string]int, id func(Record) string, allowDuplicates bool) string {
	where := func(r Record) string {
		return fmt.Sprintf("partition %d offset %d", r.Record.Partition, r.Record.Offset)
	}
	seen := map[string][]Record{}
	var order []string // ids in the order first found
	var unexpected []Record
	type last struct {
		id  string
		rec Record
	}
	lastOfKey := map[string]last{}
	var breaks []string
	for _, r := range recs {
		rid := id(r)
		if _, ok := index[rid]; !ok {
			unexpected = append(unexpected, r)
			continue
		}
		if len(seen[rid]) == 0 {
			order = append(order, rid)
		}
		seen[rid] = append(seen[rid], r)
		if r.Record.Key == nil || len(seen[rid]) > 1 {
			continue // unordered, or a copy (reported as a duplicate)
		}
		key := string(r.Record.Key)
		if prev, ok := lastOfKey[key]; ok && index[prev.id] > index[rid] {
			breaks = append(breaks, fmt.Sprintf("key %q: %q (%s) comes after %q (%s); want lists %q first",
				key, rid, where(r), prev.id, where(prev.rec), rid))
			continue // keep the later id as the key's high mark
		}
		lastOfKey[key] = last{id: rid, rec: r}
	}
	var b strings.Builder
	var dups []string
	for _, rid := range order {
		if copies := seen[rid]; len(copies) > 1 && !allowDuplicates {
			places := make([]string, len(copies))
			for i, r := range copies {
				places[i] = where(r)
			}
			dups = append(dups, fmt.Sprintf("%q %d times: %s", rid, len(copies), strings.Join(places, ", ")))
		}
	}
	section(&b, fmt.Sprintf("duplicated: %s", plural(len(dups), "message id")), dups)
	var missing []string
	for _, rid := range want {
		if len(seen[rid]) == 0 {
			missing = append(missing, strconv.Quote(rid))
		}
	}
	section(&b, fmt.Sprintf("missing: %d of %s", len(missing), plural(len(want), "message id")), missing)
	lines := make([]string, len(unexpected))
	for i, r := range unexpected {
		switch {
		case r.DecodeErr != nil:
			lines[i] = fmt.Sprintf("%s: not a keiro record (%v): key %q", where(r), r.DecodeErr, r.Record.Key)
		default:
			lines[i] = fmt.Sprintf("%s: id %q not wanted: %s", where(r), id(r), summary(r.Event))
		}
	}
	section(&b, fmt.Sprintf("unexpected: %s", plural(len(unexpected), "record")), lines)
	section(&b, fmt.Sprintf("out of key order: %s", plural(len(breaks), "record")), breaks)
	return b.String()
}

// section writes a titled list of a failure message, at most maxListed lines, if lines is
// not empty.
func section(b *strings.Builder, title string, lines []string) {
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "\n  %s", title)
	for _, l := range lines[:min(len(lines), maxListed)] {
		fmt.Fprintf(b, "\n    %s", l)
	}
	if len(lines) > maxListed {
		fmt.Fprintf(b, "\n    … and %d more", len(lines)-maxListed)
	}
}

// readCommitted reads topic as a read_committed consumer would (testenv.ReadCommitted) and
// decodes the records.
func readCommitted(ctx context.Context, kafka *Kafka, topic string) (Committed, error) {
	c, err := testenv.ReadCommitted(ctx, kafka.Kafka, topic)
	if err != nil {
		return Committed{}, err
	}
	return Committed{Records: decodeAll(c.Records), Aborted: c.Aborted, Open: c.Open}, nil
}
