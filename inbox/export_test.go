package inbox

import (
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/inbox/internal/buffer"
)

// SetPollHook makes c call hook after each poll, before dispatching the poll's records.
func SetPollHook(c *Consumer, hook func(kgo.Fetches)) { c.pollHook = hook }

// PressureEvent is one back-pressure event of a partition: "hold" (the poll loop holds up its
// next poll because the partition's buffer is full), "pause" or "resume" (its fetches).
type PressureEvent struct {
	Kind      string
	Topic     string
	Partition int32
}

// SetPressureHook makes c call hook on each back-pressure event. Holds and pauses are
// reported from the poll loop before it polls again (a partition the poll loop found empty is
// still empty meanwhile); resumes from the partition's worker.
func SetPressureHook(c *Consumer, hook func(PressureEvent)) {
	kinds := map[pressureEvent]string{pressureHold: "hold", pressurePause: "pause", pressureResume: "resume"}
	c.pressureHook = func(ev pressureEvent, tp topicPartition) {
		hook(PressureEvent{Kind: kinds[ev], Topic: tp.topic, Partition: tp.partition})
	}
}

// Buffered returns the records buffered per assigned partition ("topic/partition"), not
// counting those taken for processing.
func Buffered(c *Consumer) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.workers))
	for tp, w := range c.workers {
		w.mu.Lock()
		out[tp.topic+"/"+strconv.Itoa(int(tp.partition))] = w.buf.Len()
		w.mu.Unlock()
	}
	return out
}

// RecordBytes is what r counts for MaxBufferedBytes.
func RecordBytes(r *kgo.Record) int { return buffer.RecordBytes(r) }
