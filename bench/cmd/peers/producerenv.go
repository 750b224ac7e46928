package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The keiro contenders' producer under two environment variables, for measuring how the
// broker's CPU depends on what the relay sends: PEERS_PRODUCE_STATS=1 prints, when a keiro
// relay stops, its produce requests, record batches, records per batch and bytes per batch;
// PEERS_KGO=compression=none|snappy|lz4|zstd|gzip,batchmax=BYTES,linger=DURATION appends
// those franz-go options to outbox.ProducerOpts() (the figures then are not keiro's defaults').

// produceStats are the counts PEERS_PRODUCE_STATS prints.
var produceStats struct{ batches, records, compressed, uncompressed, requests atomic.Int64 }

// statsHook counts the produce requests and record batches written.
type statsHook struct{}

func (statsHook) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.ProduceBatchMetrics) {
	produceStats.batches.Add(1)
	produceStats.records.Add(int64(m.NumRecords))
	produceStats.compressed.Add(int64(m.CompressedBytes))
	produceStats.uncompressed.Add(int64(m.UncompressedBytes))
}

func (statsHook) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err == nil {
		produceStats.requests.Add(1)
	}
}

// printProduceStats prints the counts when PEERS_PRODUCE_STATS is set.
func printProduceStats() {
	if os.Getenv("PEERS_PRODUCE_STATS") == "" {
		return
	}
	b, r, req := produceStats.batches.Load(), produceStats.records.Load(), produceStats.requests.Load()
	if b == 0 || req == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "      produce: %d requests, %d batches, %.1f records/batch, %.1f records/request, %.0f B/batch compressed (%.0f uncompressed)\n",
		req, b, float64(r)/float64(b), float64(r)/float64(req), float64(produceStats.compressed.Load())/float64(b), float64(produceStats.uncompressed.Load())/float64(b))
}

// experimentOpts are the options PEERS_PRODUCE_STATS and PEERS_KGO add to the keiro relays' producer.
func experimentOpts() []kgo.Opt {
	var opts []kgo.Opt
	if os.Getenv("PEERS_PRODUCE_STATS") != "" {
		opts = append(opts, kgo.WithHooks(statsHook{}))
	}
	for _, kv := range strings.Split(os.Getenv("PEERS_KGO"), ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "compression":
			c := map[string]kgo.CompressionCodec{"none": kgo.NoCompression(), "lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(), "snappy": kgo.SnappyCompression(), "gzip": kgo.GzipCompression()}[v]
			opts = append(opts, kgo.ProducerBatchCompression(c))
		case "batchmax":
			n, _ := strconv.Atoi(v)
			opts = append(opts, kgo.ProducerBatchMaxBytes(int32(n)))
		case "linger":
			d, _ := time.ParseDuration(v)
			opts = append(opts, kgo.ProducerLinger(d))
		}
	}
	return opts
}
