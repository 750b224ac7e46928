package inbox

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/inbox/internal/buffer"
	"github.com/keiro-go/keiro/tracing"
)

// Back-pressure: the decisions (hold the next poll, pause full partitions, resume a paused
// one) are inbox/internal/buffer's (see buffer.Decide); this file acts on them, against the
// client and the test hook.

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
		var ws []*partitionWorker
		var states []buffer.State
		c.mu.Lock()
		for _, w := range c.workers {
			ws = append(ws, w)
			states = append(states, w.state())
		}
		c.mu.Unlock()
		action, full := buffer.Decide(states)
		switch action {
		case buffer.Poll:
			return
		case buffer.PauseFull:
			for _, i := range full {
				ws[i].pause()
			}
			return
		}
		for _, i := range full {
			c.pressure(pressureHold, ws[i].tp)
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

// state returns the worker's buffer state, for the poll loop's decision.
func (w *partitionWorker) state() buffer.State {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.State()
}

// pause stops fetching the worker's partition, if its buffer is still full, until the worker
// has worked it down to half (finish resumes it).
func (w *partitionWorker) pause() {
	w.mu.Lock()
	if !w.buf.Pause() {
		w.mu.Unlock()
		return
	}
	w.cl.PauseFetchPartitions(w.partitions())
	w.mu.Unlock()
	w.c.pressure(pressurePause, w.tp)
	w.c.fetchPauses.Add(1)
	w.c.in.fetchPauses.Add(w.ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		tracing.GroupKey.String(w.c.cfg.Group), tracing.DestinationKey.String(w.tp.topic),
		tracing.PartitionKey.String(strconv.Itoa(int(w.tp.partition))))))
}
