package inbox

import (
	"context"
	"strconv"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/tracing"
)

// Back-pressure. Each partition's worker holds at most MaxBufferedRecords records and
// MaxBufferedBytes bytes, buffered or in progress (plus one poll's worth; see fullLocked). The
// obvious bound, pausing a partition's fetches as soon as its buffer fills, costs a re-fetch:
// franz-go drops the data it has already fetched for a partition that is paused when the
// client is polled, and reads it again after the resume, so a backlog that is worked off in
// pause–resume cycles is fetched (from the broker, over the network, decoded) up to twice.
//
// So the poll loop first waits: while a partition's buffer is full and every other partition
// still has records to work on, it does not poll (the client fetches nothing more meanwhile),
// and polls again once the full worker has taken a batch. Only when another partition has run
// dry, and so needs a poll, are the full partitions paused (one re-fetch each), as a slow or
// stuck partition must not hold up the others. A paused partition resumes once its worker has
// worked its buffer down to half.

// pressureEvent is what the back-pressure hook (Consumer.pressureHook, set by tests) reports.
type pressureEvent int

const (
	// pressureHold: the poll loop holds up its next poll because a buffer is full and no
	// other partition has run dry.
	pressureHold pressureEvent = iota
	// pressurePause: a partition's fetches were paused.
	pressurePause
	// pressureResume: a paused partition's fetches were resumed.
	pressureResume
)

// pressure reports ev for tp to the test hook, if one is set. It must be called without w.mu
// or c.mu held. Hold and pause are reported from the poll loop's goroutine, before it polls
// again, so a partition the poll loop found empty is still empty while the hook runs (only the
// poll loop adds records to a buffer).
func (c *Consumer) pressure(ev pressureEvent, tp topicPartition) {
	if c.pressureHook != nil {
		c.pressureHook(ev, tp)
	}
}

// roomCheck bounds how long the poll loop waits for a full buffer without a signal before it
// looks again.
const roomCheck = time.Second

// awaitRoom returns when a poll is useful: no unpaused partition's buffer is full, or one is
// and another partition ran dry, in which case the full ones are paused first. It also returns
// when ctx ends.
func (c *Consumer) awaitRoom(ctx context.Context) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var full []*partitionWorker
		dry := false
		c.mu.Lock()
		for _, w := range c.workers {
			switch isFull, empty, paused := w.state(); {
			case isFull && !paused:
				full = append(full, w)
			case empty:
				dry = true
			}
		}
		c.mu.Unlock()
		if len(full) == 0 {
			return
		}
		if dry {
			for _, w := range full {
				w.pause()
			}
			return
		}
		for _, w := range full {
			c.pressure(pressureHold, w.tp)
		}
		if timer == nil {
			timer = time.NewTimer(roomCheck)
		} else {
			timer.Reset(roomCheck)
		}
		select {
		case <-ctx.Done():
			return
		case <-c.room:
		case <-timer.C:
		}
	}
}

// signalRoom wakes the poll loop if it waits in awaitRoom: a worker finished records it took
// from its buffer, or the set of workers changed.
func (c *Consumer) signalRoom() {
	select {
	case c.room <- struct{}{}:
	default:
	}
}

// state reports whether the worker's buffer is full or empty, and whether its partition is
// paused.
func (w *partitionWorker) state() (full, empty, paused bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fullLocked(), len(w.queue) == 0, w.paused
}

// fullLocked reports that the partition holds MaxBufferedRecords records or MaxBufferedBytes
// bytes, buffered or in progress (taken and not yet finished). A poll adds at most one fetch
// per partition, so a partition never holds more than that over its bounds. w.mu must be held.
func (w *partitionWorker) fullLocked() bool {
	return len(w.queue)+w.held >= w.c.cfg.MaxBufferedRecords || w.bytes+w.heldBytes >= w.c.cfg.MaxBufferedBytes
}

// recordBytes is what a record counts for MaxBufferedBytes: what it takes in memory, its key,
// value and headers and the Go structures that hold them (the client's decoded form of the
// record, kmsg.Record, lives as long as the kgo.Record made from it). The structures matter
// for small records: a keiro record's 19 headers take about 1.8 KiB of them.
func recordBytes(r *kgo.Record) int {
	n := recordOverhead + len(r.Key) + len(r.Value) + len(r.Headers)*headerOverhead
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// The Go structures of one record and of one of its headers.
const (
	recordOverhead = int(unsafe.Sizeof(kgo.Record{}) + unsafe.Sizeof(kmsg.Record{}))
	headerOverhead = int(unsafe.Sizeof(kgo.RecordHeader{}) + unsafe.Sizeof(kmsg.Header{}))
)

// pause stops fetching the worker's partition, if its buffer is still full, until the worker
// has worked it down to half (finish resumes it).
func (w *partitionWorker) pause() {
	w.mu.Lock()
	if w.paused || !w.fullLocked() {
		w.mu.Unlock()
		return
	}
	w.paused = true
	w.cl.PauseFetchPartitions(w.partitions())
	w.mu.Unlock()
	w.c.pressure(pressurePause, w.tp)
	w.c.fetchPauses.Add(1)
	w.c.in.fetchPauses.Add(w.ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		tracing.GroupKey.String(w.c.cfg.Group), tracing.DestinationKey.String(w.tp.topic),
		tracing.PartitionKey.String(strconv.Itoa(int(w.tp.partition))))))
}
