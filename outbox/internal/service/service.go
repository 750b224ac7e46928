// Package service runs the relay's background loops (its LISTEN session, maintenance, vacuum,
// claim shares, lease renewal, claimers and producer) as services with one lifecycle: each
// runs until its context ends, and a Group starts them together and waits for them together,
// as river's maintenance services are started and stopped by one client.
package service

import (
	"context"
	"sync"
)

// Service is a background loop: Run works until ctx ends (or its work is done) and returns
// once it stopped for good.
type Service interface {
	Run(ctx context.Context)
}

// Func is a function as a Service.
type Func func(ctx context.Context)

// Run calls f.
func (f Func) Run(ctx context.Context) { f(ctx) }

// Group is services started together and waited for together. The zero value is ready.
type Group struct {
	wg sync.WaitGroup
}

// Go starts each of services on a goroutine of its own under ctx.
func (g *Group) Go(ctx context.Context, services ...Service) {
	for _, s := range services {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			s.Run(ctx)
		}()
	}
}

// Wait returns once every service started by Go has returned.
func (g *Group) Wait() { g.wg.Wait() }
