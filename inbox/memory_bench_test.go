package inbox_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// BenchmarkConsumerMemory measures what a consumer with the default configuration holds
// while it works off a backlog, compressed with snappy as the relay produces it, that
// overfills every partition's buffer and what its fetches would hold decompressed: peak RSS (VmHWM) and
// peak Go heap of a process that runs only the consumer, against the sizing formula of
// docs/operations.md (consumerLive, consumerLimit), and its CPU per record with GOGC=200 (what
// the binaries run with) under no memory limit, under the Kubernetes overlay's limit and under
// the limit the formula asks for, each applied as the binaries apply it (GOMEMLIMIT = 90 % of
// the container's limit). Each case runs in two child processes of
// the test binary: an embedded broker holding the backlog, and the consumer, so that neither
// the broker's log nor an earlier case shows in the consumer's figures.
//
//	go test -run XXX -bench ConsumerMemory -benchtime 1x ./inbox
//
// KEIRO_MEMBENCH_HEAPPROFILE=<file> makes each consumer child write its heap profile (after a
// collection) when half of its backlog is committed.
func BenchmarkConsumerMemory(b *testing.B) {
	if role := os.Getenv("KEIRO_MEMBENCH"); role != "" {
		memBenchChild(b, role)
		return
	}
	const k8sLimit = 256 << 20 // deploy/kubernetes: the consumer's memory limit
	for _, payload := range []int{1 << 10, 50 << 10} {
		size := inbox.RecordBytes(memBenchRecord("bench.memory.v1", 0, memBenchPayload(payload)))
		k := memBenchRatio(payload)
		for _, parts := range []int{4, 16} {
			// Enough records for each partition to hold three buffers' worth (or three times
			// its record bound), and three fetches of compressed bytes decompressed (what
			// the consumer would hold if it did not size its fetches by the ratio).
			perPart := 3*min(inbox.DefaultMaxBufferedRecords, inbox.DefaultMaxBufferedBytes/size) +
				int(3*k*(1<<20))/size
			if testing.Short() {
				perPart /= 3
			}
			n := perPart * parts
			live := consumerLive(parts, size)
			// GOMEMLIMIT as the binaries set it (90 % of the container's limit): none, the
			// Kubernetes overlay's limit, and the limit the formula asks for.
			for _, c := range []struct {
				name      string
				container int64
			}{{"off", 0}, {"k8s-256MiB", k8sLimit}, {fmt.Sprintf("formula-%dMiB", consumerLimit(live)>>20), consumerLimit(live)}} {
				name := fmt.Sprintf("payload=%dKiB/partitions=%d/limit=%s", payload>>10, parts, c.name)
				b.Run(name, func(b *testing.B) {
					res := runMemBench(b, parts, payload, n, c.container*9/10)
					b.ReportMetric(float64(res["rss"])/(1<<20), "peak-RSS-MiB")
					b.ReportMetric(float64(res["heap"])/(1<<20), "peak-heap-MiB")
					b.ReportMetric(float64(res["live"])/(1<<20), "peak-gc-live-MiB")
					b.ReportMetric(float64(live)/(1<<20), "formula-L-MiB")
					b.ReportMetric(float64(consumerLimit(live))/(1<<20), "formula-limit-MiB")
					b.ReportMetric(k, "snappy-k")
					b.ReportMetric(float64(res["uncompressed"])/float64(max(res["compressed"], 1)), "fetched-k")
					b.ReportMetric(float64(res["cpu"])/1e3/float64(n), "cpu-µs/record")
					b.ReportMetric(float64(n)/(float64(res["elapsed"])/1e9), "records/s")
					b.ReportMetric(0, "ns/op")
					if c.container == consumerLimit(live) && res["rss"] > c.container {
						b.Errorf("peak RSS %d MiB over the formula's container of %d MiB", res["rss"]>>20, c.container>>20)
					}
				})
			}
		}
	}
}

// memBenchPayload is a JSON payload of about size bytes.
func memBenchPayload(size int) []byte {
	return []byte(`{"blob":"` + strings.Repeat("x", max(size-12, 0)) + `"}`)
}

// memBenchRecord is the i-th record of the benchmark's backlog.
func memBenchRecord(topic string, i int, payload []byte) *kgo.Record {
	ev := newEvent("ordering", topic)
	k := fmt.Sprintf("key-%d", i%64)
	ev.Key, ev.Payload = &k, payload
	return toKgo(ev.Record(envelope.EncodeOptions{}))
}

// consumerLive is docs/operations.md's estimate L of what a consumer with the default
// configuration holds, owning parts partitions of records that count size bytes each (as
// MaxBufferedBytes counts them: key, value, headers and their Go structures): each partition
// holds at most its bounds, buffered and in progress, plus three fetches (the one that tops
// the buffer over its bound, the Kafka client's next one, and the rest of a fetched batch whose
// first records are done; the consumer sizes its fetch requests by the compression ratio it
// measures, so that a fetch holds about FetchMaxPartitionBytes once decompressed); up to
// MaxConcurrentPartitions batches (at most BatchSize records and a quarter of
// MaxBufferedBytes) are processed at once, each turned into about four times its bytes
// (decoded events, the inbox rows' parameters, the connection's buffers); plus 16 MiB for the
// runtime, the clients and the pools.
func consumerLive(parts, size int) int64 {
	const fetch = 1 << 20 // kgo's FetchMaxPartitionBytes default
	held := min(int64(inbox.DefaultMaxBufferedBytes), int64(inbox.DefaultMaxBufferedRecords)*int64(size))
	batch := min(int64(inbox.DefaultBatchSize)*int64(size), int64(inbox.DefaultMaxBufferedBytes)/4)
	return int64(parts)*(held+3*fetch) + int64(min(parts, inbox.DefaultMaxConcurrentPartitions))*4*batch + 16<<20
}

// memBenchRatio is k, the compression ratio of the benchmark's record batches as its producer
// writes them (snappy, the Kafka client's default and the relay's): a producer batch's worth
// of records (1 MiB) compressed. Its synthetic payloads (one repeated character) compress
// about 15 to 1.
func memBenchRatio(payload int) float64 {
	var src []byte
	for i := 0; len(src) < 1<<20; i++ {
		r := memBenchRecord("bench.memory.v1", i, memBenchPayload(payload))
		src = append(append(src, r.Key...), r.Value...)
		for _, h := range r.Headers {
			src = append(append(src, h.Key...), h.Value...)
		}
	}
	c, err := kgo.DefaultCompressor(kgo.SnappyCompression())
	if err != nil {
		panic(err)
	}
	out, _ := c.Compress(new(bytes.Buffer), src)
	return float64(len(src)) / float64(len(out))
}

// fetchRatio counts the compressed and uncompressed bytes of the batches the consumer fetches.
type fetchRatio struct{ compressed, uncompressed atomic.Int64 }

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (f *fetchRatio) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	f.compressed.Add(int64(m.CompressedBytes))
	f.uncompressed.Add(int64(m.UncompressedBytes))
}

// consumerLimit is the container memory limit docs/operations.md asks for: 2 × L + 48 MiB.
func consumerLimit(live int64) int64 { return 2*live + 48<<20 }

// runMemBench runs one case: a broker child with n records of size bytes over parts
// partitions, then a consumer child that works them off. It returns the consumer's figures.
func runMemBench(b *testing.B, parts, size, n int, limit int64) map[string]int64 {
	b.Helper()
	spec := fmt.Sprintf("%d:%d:%d", parts, size, n)
	broker := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkConsumerMemory$", "-test.benchtime=1x")
	broker.Env = append(os.Environ(), "KEIRO_MEMBENCH=broker:"+spec)
	stdin, err := broker.StdinPipe()
	require.NoError(b, err)
	out, err := broker.StdoutPipe()
	require.NoError(b, err)
	broker.Stderr = os.Stderr
	require.NoError(b, broker.Start())
	defer func() {
		stdin.Close() // the broker exits when its stdin closes
		_ = broker.Wait()
	}()
	addr := ""
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "MEMBENCH-BROKER "); ok {
			addr = a
			break
		}
	}
	require.NotEmpty(b, addr, "the broker child did not start")
	go func() {
		for sc.Scan() { // drain
		}
	}()

	consumer := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkConsumerMemory$", "-test.benchtime=1x")
	consumer.Env = append(os.Environ(), "KEIRO_MEMBENCH=consumer:"+spec+":"+addr, "GOGC=200")
	if limit > 0 {
		consumer.Env = append(consumer.Env, "GOMEMLIMIT="+strconv.FormatInt(limit, 10))
	} else {
		consumer.Env = append(consumer.Env, "GOMEMLIMIT=off")
	}
	consumer.Stderr = os.Stderr
	output, err := consumer.Output()
	require.NoError(b, err, "consumer child: %s", output)
	for line := range strings.Lines(string(output)) {
		fields, ok := strings.CutPrefix(strings.TrimSpace(line), "MEMBENCH-RESULT ")
		if !ok {
			continue
		}
		res := map[string]int64{}
		for f := range strings.FieldsSeq(fields) {
			k, v, _ := strings.Cut(f, "=")
			res[k], err = strconv.ParseInt(v, 10, 64)
			require.NoError(b, err)
		}
		return res
	}
	b.Fatalf("the consumer child reported nothing: %s", output)
	return nil
}

// memBenchChild is one child process of BenchmarkConsumerMemory: "broker:parts:size:n" or
// "consumer:parts:size:n:addr".
func memBenchChild(b *testing.B, role string) {
	f := strings.Split(role, ":")
	parts, _ := strconv.Atoi(f[1])
	size, _ := strconv.Atoi(f[2])
	n, _ := strconv.Atoi(f[3])
	const topic = "bench.memory.v1"
	switch f[0] {
	case "broker":
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(parts), topic))
		require.NoError(b, err)
		defer c.Close()
		prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerBatchMaxBytes(1<<20),
			kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
		require.NoError(b, err)
		payload := memBenchPayload(size)
		for i := 0; i < n; {
			var batch []*kgo.Record
			for ; i < n && len(batch) < 500; i++ {
				batch = append(batch, memBenchRecord(topic, i, payload))
			}
			require.NoError(b, prod.ProduceSync(context.Background(), batch...).FirstErr())
		}
		prod.Close()
		fmt.Println("MEMBENCH-BROKER " + c.ListenAddrs()[0])
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
	case "consumer":
		addr := strings.Join(f[4:], ":")
		db := testenv.NewDB(b)
		fx := newEffects(b, db)
		base := procStatus("VmRSS")
		p := newProgress()
		var ratio fetchRatio
		c, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
			Brokers: []string{addr}, Group: "bench", Topics: []string{topic},
			Store:       inbox.StoreConfig{Schema: db.Schema},
			OnCommitted: p.onCommitted, Logger: slog.New(slog.DiscardHandler),
			KafkaOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithHooks(&ratio)},
		}, fx.handler())
		require.NoError(b, err)
		var heap, live atomic.Int64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
			t := time.NewTicker(2 * time.Millisecond)
			defer t.Stop()
			for {
				metrics.Read(samples)
				heap.Store(max(heap.Load(), int64(samples[0].Value.Uint64())))
				live.Store(max(live.Load(), int64(samples[1].Value.Uint64())))
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
		}()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		cpu0, start := processCPU(), time.Now()
		go func() { done <- c.Run(ctx) }()
		if path := os.Getenv("KEIRO_MEMBENCH_HEAPPROFILE"); path != "" {
			p.waitCommitted(b, topic, int64(n/2), 10*time.Minute)
			fh, err := os.Create(path)
			require.NoError(b, err)
			runtime.GC()
			require.NoError(b, pprof.WriteHeapProfile(fh))
			fh.Close()
		}
		p.waitCommitted(b, topic, int64(n), 10*time.Minute)
		elapsed, cpu := time.Since(start), processCPU()-cpu0
		close(stop)
		<-sampled
		rss := procStatus("VmHWM")
		cancel()
		require.NoError(b, <-done)
		fmt.Printf("MEMBENCH-RESULT rss=%d base=%d heap=%d live=%d cpu=%d elapsed=%d compressed=%d uncompressed=%d\n",
			rss, base, heap.Load(), live.Load(), cpu.Nanoseconds(), elapsed.Nanoseconds(),
			ratio.compressed.Load(), ratio.uncompressed.Load())
	}
}

// procStatus reads a memory field of /proc/self/status, in bytes.
func procStatus(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
