package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// faults injects produce failures into a kfake cluster through its control hook.
type faults struct {
	mu sync.Mutex
	// every fails one produce request in every n (0: none).
	every int
	// code is the error code the failed requests answer for every partition.
	code int16
	// all fails every produce request (an outage) while set.
	all      bool
	requests int
	failed   atomic.Int64
}

func injectFaults(kc *testenv.Kafka) *faults {
	f := &faults{}
	kc.Cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		f.mu.Lock()
		f.requests++
		fail := f.all || (f.every > 0 && f.requests%f.every == 0)
		code := f.code
		f.mu.Unlock()
		if !fail {
			return nil, nil, false
		}
		f.failed.Add(1)
		return produceError(req, code), nil, true
	})
	return f
}

func (f *faults) set(fn func(f *faults)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// produceError answers every partition of req with code.
var produceError = testenv.ProduceError

// runRestarting runs a relay until ctx ends, restarting it when a StopTheLine halt stops it
// (what an operator would do after review).
func runRestarting(ctx context.Context, r *outbox.Relay, halts *atomic.Int64) error {
	for {
		err := r.Run(ctx)
		if !errors.Is(err, outbox.ErrHalted) {
			return err
		}
		halts.Add(1)
	}
}

// Short names for the control hook's signature.
type (
	kmsgReq  = kmsg.Request
	kmsgResp = kmsg.Response
)

const kmsgProduce = kmsg.Produce
