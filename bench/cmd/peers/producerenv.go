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

// experimentOpts are the options PEERS_PRODUCE_STATS and PEERS_KGO add to the keiro relays'
// producer. A PEERS_KGO entry it does not know, or a value it cannot parse, is an error naming
// it: a run must not silently measure the defaults instead of what was asked.
func experimentOpts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if os.Getenv("PEERS_PRODUCE_STATS") != "" {
		opts = append(opts, kgo.WithHooks(statsHook{}))
	}
	spec := os.Getenv("PEERS_KGO")
	if spec == "" {
		return opts, nil
	}
	codecs := map[string]kgo.CompressionCodec{"none": kgo.NoCompression(), "lz4": kgo.Lz4Compression(),
		"zstd": kgo.ZstdCompression(), "snappy": kgo.SnappyCompression(), "gzip": kgo.GzipCompression()}
	for _, kv := range strings.Split(spec, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "compression":
			c, ok := codecs[v]
			if !ok {
				return nil, fmt.Errorf("PEERS_KGO: compression %q is not one of none, snappy, lz4, zstd, gzip", v)
			}
			opts = append(opts, kgo.ProducerBatchCompression(c))
		case "batchmax":
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("PEERS_KGO: batchmax %q is not a positive number of bytes", v)
			}
			opts = append(opts, kgo.ProducerBatchMaxBytes(int32(n)))
		case "linger":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return nil, fmt.Errorf("PEERS_KGO: linger %q is not a duration of 0 or more", v)
			}
			opts = append(opts, kgo.ProducerLinger(d))
		default:
			return nil, fmt.Errorf("PEERS_KGO: unknown entry %q (want compression=, batchmax= or linger=)", kv)
		}
	}
	return opts, nil
}
