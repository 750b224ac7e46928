package inbox

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The Kafka client bounds a fetch by its compressed bytes (FetchMaxBytes, and
// FetchMaxPartitionBytes per partition): a consumer cannot ask Kafka for a decompressed bound,
// so records compressed k to 1 make every fetch hold k times what the client is configured
// for, outside MaxBufferedBytes. fetchSizer keeps a fetch's decompressed bytes near the
// configured sizes: it measures the compression ratio of the batches the client reads
// (kgo.HookFetchBatchRead, called before the client builds its next fetch request for the
// broker) and asks for the configured sizes divided by it. It starts as if batches were
// compressed [initialFetchRatio] to 1, so that the first fetches, before anything is measured,
// stay within the configured sizes too; the broker still returns a partition's first batch
// whole when it is larger, so a partition always makes progress.
type fetchSizer struct {
	cl *kgo.Client
	// maxBytes and maxPartBytes are the sizes the client was configured with: the bounds of a
	// fetch's decompressed bytes.
	maxBytes, maxPartBytes int32

	mu sync.Mutex
	// compressed and uncompressed are the bytes of recent batches, halved whenever compressed
	// passes the window, so that the ratio follows what the topics hold now.
	compressed, uncompressed float64
	ratio                    float64 // the ratio the client's sizes are set for
}

// initialFetchRatio is the compression ratio a consumer assumes before it has measured one.
const initialFetchRatio = 16

// newFetchSizer sets cl's fetch sizes for batches compressed initialFetchRatio to 1. Call it
// before the client fetches, with the sizes it was configured with.
func newFetchSizer(cl *kgo.Client) *fetchSizer {
	f := &fetchSizer{cl: cl, ratio: initialFetchRatio}
	f.maxBytes, _ = cl.OptValue(kgo.FetchMaxBytes).(int32)
	f.maxPartBytes, _ = cl.OptValue(kgo.FetchMaxPartitionBytes).(int32)
	f.apply()
	return f
}

// apply asks the client for the configured sizes divided by the ratio in force.
func (f *fetchSizer) apply() {
	if f.maxBytes <= 0 || f.maxPartBytes <= 0 {
		return
	}
	f.cl.UpdateFetchMaxBytes(max(1, int32(float64(f.maxBytes)/f.ratio)), max(1, int32(float64(f.maxPartBytes)/f.ratio)))
}

// fetchSizerHook forwards the client's batch metrics to the sizer once the client exists (the
// hook is an option of the client it sizes).
type fetchSizerHook struct {
	mu sync.Mutex
	f  *fetchSizer
}

func (h *fetchSizerHook) set(f *fetchSizer) {
	h.mu.Lock()
	h.f = f
	h.mu.Unlock()
}

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (h *fetchSizerHook) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	h.mu.Lock()
	f := h.f
	h.mu.Unlock()
	if f != nil {
		f.batchRead(m.CompressedBytes, m.UncompressedBytes)
	}
}

// batchRead counts one batch and, when the measured ratio moved by more than an eighth from
// the one in force, resizes the client's fetches.
func (f *fetchSizer) batchRead(compressed, uncompressed int) {
	if compressed <= 0 || uncompressed <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.compressed += float64(compressed)
	f.uncompressed += float64(uncompressed)
	ratio := max(1, f.uncompressed/f.compressed)
	if window := 4 * float64(f.maxPartBytes); window > 0 && f.compressed > window {
		f.compressed /= 2
		f.uncompressed /= 2
	}
	if ratio > f.ratio*9/8 || ratio < f.ratio*7/8 {
		f.ratio = ratio
		f.apply()
	}
}
