package inbox

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The consumer group's rebalance callbacks: an assigned partition gets a worker, a revoked one
// finishes its record and commits before it is released, a lost one stops without committing.

func (c *Consumer) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range assigned {
		for _, p := range parts {
			tp := topicPartition{topic, p}
			if _, ok := c.workers[tp]; ok {
				continue
			}
			w := newPartitionWorker(c, cl, tp)
			c.workers[tp] = w
			go w.run()
		}
	}
	c.signalRoom()
}

func (c *Consumer) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.stopWorkers(revoked, true)
}

func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.stopWorkers(lost, false)
}

// stopWorkers stops the workers of parts (all when nil) and waits for them: each finishes the
// record it is on and, when commit is true, commits what it completed.
func (c *Consumer) stopWorkers(parts map[string][]int32, commit bool) {
	c.mu.Lock()
	var stopping []*partitionWorker
	for tp, w := range c.workers {
		if parts != nil && !containsPartition(parts, tp) {
			continue
		}
		delete(c.workers, tp)
		stopping = append(stopping, w)
	}
	c.mu.Unlock()
	c.signalRoom()
	for _, w := range stopping {
		w.stop(commit)
	}
	if len(stopping) == 0 {
		return
	}
	timer := time.NewTimer(c.cfg.ShutdownTimeout)
	defer timer.Stop()
	for _, w := range stopping {
		select {
		case <-w.done:
		case <-timer.C:
			c.log.Warn("in-flight work did not finish within the shutdown timeout; abandoning it (it will be redelivered)",
				"topic", w.tp.topic, "partition", w.tp.partition)
			for _, w := range stopping {
				w.cancel()
			}
			for _, w := range stopping {
				<-w.done
			}
			return
		}
	}
}

func containsPartition(parts map[string][]int32, tp topicPartition) bool {
	for _, p := range parts[tp.topic] {
		if p == tp.partition {
			return true
		}
	}
	return false
}
