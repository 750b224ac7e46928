package buffer

// Back-pressure. Each partition's worker holds at most its Limits, buffered or in progress
// (plus one poll's worth; see Buffer.Full). The obvious bound, pausing a partition's fetches
// as soon as its buffer fills, costs a re-fetch: franz-go drops the data it has already
// fetched for a partition that is paused when the client is polled, and reads it again after
// the resume, so a backlog that is worked off in pause–resume cycles is fetched (from the
// broker, over the network, decoded) up to twice.
//
// So the poll loop first waits: while a partition's buffer is full and every other partition
// still has records to work on, it does not poll (the client fetches nothing more meanwhile),
// and polls again once the full worker has taken a batch. Only when another partition has run
// dry, and so needs a poll, are the full partitions paused (one re-fetch each), as a slow or
// stuck partition must not hold up the others. A paused partition resumes once its worker has
// worked its buffer down to half (Buffer.Finish).

// State is one partition's buffer as the poll loop sees it before a poll.
type State struct {
	// Full: the partition holds its bounds (Buffer.Full).
	Full bool
	// Empty: no record is buffered (some may still be in progress).
	Empty bool
	// Paused: the partition's fetches are paused.
	Paused bool
}

// Action is what the poll loop does before its next poll.
type Action int

const (
	// Poll: no unpaused partition's buffer is full; poll now.
	Poll Action = iota
	// Hold: a buffer is full and no other partition has run dry; wait for room (a worker
	// finishing records) before polling.
	Hold
	// PauseFull: a buffer is full and another partition has run dry and needs a poll; pause
	// the full partitions' fetches, then poll.
	PauseFull
)

// String names a for logs and tests.
func (a Action) String() string {
	switch a {
	case Poll:
		return "poll"
	case Hold:
		return "hold"
	case PauseFull:
		return "pause"
	}
	return "unknown"
}

// Decide returns what the poll loop does given its partitions' states, and for Hold and
// PauseFull the indexes in states of the full, unpaused partitions (those to hold for or to
// pause).
func Decide(states []State) (Action, []int) {
	var full []int
	dry := false
	for i, s := range states {
		switch {
		case s.Full && !s.Paused:
			full = append(full, i)
		case s.Empty:
			dry = true
		}
	}
	switch {
	case len(full) == 0:
		return Poll, nil
	case dry:
		return PauseFull, full
	default:
		return Hold, full
	}
}
