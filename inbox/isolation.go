package inbox

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// IsolationLevel is which records of transactional producers a Consumer reads (Kafka's
// isolation.level). The zero value is ReadCommitted.
type IsolationLevel int8

const (
	// ReadCommitted reads only records whose producer transaction committed, and records of
	// producers that use no transactions: a record of an aborted transaction never reaches a
	// handler or the inbox, and a partition is read no further than its last stable offset
	// (the first record of a transaction still open). It is the default, and the level that
	// exactly-once publication (a relay publishing in Kafka transactions) requires of its
	// readers.
	ReadCommitted IsolationLevel = iota
	// ReadUncommitted reads every record as soon as it is written, including records of
	// transactions that are still open or were aborted: a handler may see an event that was
	// never published. Choose it only to read topics no transactional producer writes, where it
	// changes nothing, or to inspect what aborted transactions left on a topic.
	ReadUncommitted
)

// String returns the level's flag spelling: "read_committed" or "read_uncommitted".
func (l IsolationLevel) String() string {
	switch l {
	case ReadCommitted:
		return "read_committed"
	case ReadUncommitted:
		return "read_uncommitted"
	}
	return fmt.Sprintf("IsolationLevel(%d)", int8(l))
}

// ParseIsolationLevel parses "read_committed" or "read_uncommitted" (Kafka's spellings of
// isolation.level).
func ParseIsolationLevel(s string) (IsolationLevel, error) {
	switch s {
	case "read_committed":
		return ReadCommitted, nil
	case "read_uncommitted":
		return ReadUncommitted, nil
	}
	return 0, fmt.Errorf("unknown isolation level %q: use read_committed or read_uncommitted", s)
}

// kgo returns the franz-go fetch isolation level of l (which validate has checked).
func (l IsolationLevel) kgo() kgo.IsolationLevel {
	if l == ReadUncommitted {
		return kgo.ReadUncommitted()
	}
	return kgo.ReadCommitted()
}
