package service_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/keiro-go/keiro/outbox/internal/service"
)

// Wait returns once every service stopped, each having seen its context end.
func TestGroupStopsTogether(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var g service.Group
	var stopped atomic.Int64
	started := make(chan struct{}, 3)
	loop := service.Func(func(ctx context.Context) {
		started <- struct{}{}
		<-ctx.Done()
		stopped.Add(1)
	})
	g.Go(ctx, loop, loop, loop)
	for range 3 {
		<-started
	}
	cancel()
	g.Wait()
	if n := stopped.Load(); n != 3 {
		t.Fatalf("stopped %d services, want 3", n)
	}
}
