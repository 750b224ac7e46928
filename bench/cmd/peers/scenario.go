package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// generator builds the benchmark's events: a sequence number, the enqueue time and padding,
// as JSON (Watermill's default table stores payloads as JSON).
type generator struct {
	keys []string
	pad  string
	next int
}

func newGenerator(keys, payloadBytes int) *generator {
	g := &generator{keys: make([]string, keys), pad: strings.Repeat("x", max(0, payloadBytes-48))}
	for i := range g.keys {
		g.keys[i] = fmt.Sprintf("customer-%d", i)
	}
	return g
}

// msg is one benchmark event.
type msg struct {
	n       int
	key     string
	payload []byte
}

// batch returns the next n events, stamped with the current time.
func (g *generator) batch(n int) []msg {
	now := time.Now().UnixNano()
	out := make([]msg, n)
	for i := range out {
		g.next++
		out[i] = msg{n: g.next, key: g.keys[g.next%len(g.keys)],
			payload: fmt.Appendf(nil, `{"n":%d,"t":%d,"pad":"%s"}`, g.next, now, g.pad)}
	}
	return out
}

// stamp is what the verifier reads back from a payload.
type stamp struct {
	N int   `json:"n"`
	T int64 `json:"t"`
}

// enqueue writes msgs in one transaction the way contender c's users would.
func enqueue(ctx context.Context, conn *pgx.Conn, c contender, schema, topic string, msgs []msg) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		switch c.kind {
		case kindKeiro, kindDebezium:
			if c.emit {
				return emitKeiro(ctx, tx, schema, topic, msgs)
			}
			return enqueueKeiro(ctx, tx, schema, topic, msgs)
		case kindWatermill:
			return enqueueWatermill(ctx, tx, schema, topic, msgs)
		case kindSkipLocked:
			return enqueueSkipLocked(ctx, tx, schema, topic, msgs)
		}
		return fmt.Errorf("contender %s does not enqueue", c.name)
	})
}

// drain pre-enqueues o.drainN events, starts the contender and waits until the verifier has
// seen every event on the topic (or max-drain passed).
func (p *parent) drain(ctx context.Context, conn *pgx.Conn, schema, topic string, c contender, gen *generator) (result, error) {
	n := p.o.drainN
	walEnqueue, err := testenv.StartWAL(ctx, conn, schema)
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	for done := 0; done < n; {
		k := min(1000, n-done)
		if err := enqueue(ctx, conn, c, schema, topic, gen.batch(k)); err != nil {
			return result{}, fmt.Errorf("pre-enqueue: %w", err)
		}
		done += k
	}
	enqueueTook := time.Since(start)
	fmt.Fprintf(os.Stderr, "    enqueue: %d events in 1000-event transactions in %.2fs (%.0f events/s)\n",
		n, enqueueTook.Seconds(), float64(n)/enqueueTook.Seconds())
	enqueueWAL, err := walEnqueue.Stop(ctx, conn)
	if err != nil {
		return result{}, err
	}
	// Same table state for every contender (only this run's tables: the database is shared).
	if _, err := conn.Exec(ctx, fmt.Sprintf("VACUUM ANALYZE %[1]s.keiro_outbox, %[1]s.keiro_outbox_log, %[1]s.bench_outbox, %[1]s.watermill_forwarder_topic", schema)); err != nil {
		return result{}, fmt.Errorf("vacuum: %w", err)
	}
	walRelay, err := testenv.StartWAL(ctx, conn, schema)
	if err != nil {
		return result{}, err
	}
	v, err := newVerifier(ctx, p.brokers, topic, p.o.partitions, n)
	if err != nil {
		return result{}, err
	}
	defer v.close()
	cp, err := p.startChild(c, schema, topic, "", n)
	if err != nil {
		return result{}, err
	}
	t0, err := cp.waitLine(ctx, "ready", 2*time.Minute)
	if err != nil {
		_, _, _ = cp.stop()
		return result{}, err
	}
	cp.markReady()
	v.wait(ctx, p.o.maxDrain, cp.exited)
	relayWAL, werr := walRelay.Stop(ctx, conn)
	var u result
	cp.usage(&u)
	cpu, rss, err := cp.stop()
	if err = errors.Join(err, werr); err != nil {
		return result{}, err
	}
	r := v.result(c.name, "drain", t0, cpu, rss)
	r.enqueue = enqueueTook
	r.walEnqueue, r.walRelay = reportWAL(enqueueWAL), reportWAL(relayWAL)
	fmt.Fprintf(os.Stderr, "    WAL cluster-wide: enqueue %d B/ev, relay %d B/ev\n", enqueueWAL.Cluster/int64(n), relayWAL.Cluster/int64(n))
	r.relayCPU, r.pgCPU, r.brokerCPU = u.relayCPU, u.pgCPU, u.brokerCPU
	return r, nil
}

// steadyState starts the contender, offers p.o.rate events per second for p.o.steady (each
// transaction carries the events due since the last one, so a slow commit does not lower the
// offered rate) and waits until the verifier has seen them all.
func (p *parent) steadyState(ctx context.Context, conn *pgx.Conn, schema, topic string, c contender, gen *generator) (result, error) {
	n := int(float64(p.o.rate) * p.o.steady.Seconds())
	v, err := newVerifier(ctx, p.brokers, topic, p.o.partitions, n)
	if err != nil {
		return result{}, err
	}
	defer v.close()
	cp, err := p.startChild(c, schema, topic, "", n)
	if err != nil {
		return result{}, err
	}
	if _, err := cp.waitLine(ctx, "ready", 2*time.Minute); err != nil {
		_, _, _ = cp.stop()
		return result{}, err
	}
	cp.markReady()
	wal, err := testenv.StartWAL(ctx, conn, schema)
	if err != nil {
		_, _, _ = cp.stop()
		return result{}, err
	}
	t0 := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	for sent := 0; sent < n; {
		<-tick.C
		due := min(n, int(time.Since(t0).Seconds()*float64(p.o.rate))) - sent
		if due <= 0 {
			continue
		}
		if err := enqueue(ctx, conn, c, schema, topic, gen.batch(min(due, 1000))); err != nil {
			tick.Stop()
			_, _, _ = cp.stop()
			return result{}, fmt.Errorf("enqueue: %w", err)
		}
		sent += min(due, 1000)
	}
	tick.Stop()
	v.wait(ctx, 60*time.Second, cp.exited)
	steadyWAL, werr := wal.Stop(ctx, conn)
	var u result
	cp.usage(&u)
	cpu, rss, err := cp.stop()
	if err = errors.Join(err, werr); err != nil {
		return result{}, err
	}
	r := v.result(c.name, "steady", t0, cpu, rss)
	r.walRelay = reportWAL(steadyWAL) // enqueue and relay alike: they overlap
	fmt.Fprintf(os.Stderr, "    WAL cluster-wide: %d B/ev\n", steadyWAL.Cluster/int64(max(1, n)))
	r.relayCPU, r.pgCPU, r.brokerCPU = u.relayCPU, u.pgCPU, u.brokerCPU
	return r, nil
}

// consume pre-produces o.consumeN records carrying keiro's headers and Watermill's uuid
// header, starts the consumer and waits for it to report every record handled.
func (p *parent) consume(ctx context.Context, conn *pgx.Conn, schema, topic string, c contender, gen *generator) (result, error) {
	n := p.o.consumeN
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.brokers...), kgo.MaxBufferedRecords(n+1))
	if err != nil {
		return result{}, err
	}
	for _, m := range gen.batch(n) {
		ev := envelope.Event{MessageID: "m-" + strconv.Itoa(m.n), Source: "bench", Destination: topic, Key: &m.key,
			EventType: "OrderPlaced", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON, Payload: m.payload,
			OccurredAt: time.Now().UTC()}
		rec := &kgo.Record{Topic: topic, Key: []byte(m.key), Value: m.payload}
		for _, h := range ev.Headers() {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: watermillUUIDHeader, Value: []byte(ev.MessageID)})
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				fmt.Fprintln(os.Stderr, "pre-produce:", err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		cl.Close()
		return result{}, fmt.Errorf("pre-produce: %w", err)
	}
	cl.Close()
	cp, err := p.startChild(c, schema, topic, "bench-"+c.name, n)
	if err != nil {
		return result{}, err
	}
	t0, err := cp.waitLine(ctx, "ready", 60*time.Second)
	if err != nil {
		_, _, _ = cp.stop()
		return result{}, err
	}
	res := result{contender: c.name, scenario: "consume", want: n}
	t1, werr := cp.waitLine(ctx, "done", 5*time.Minute)
	cpu, rss, err := cp.stop()
	if werr != nil {
		return result{}, werr
	}
	if err != nil {
		return result{}, err
	}
	res.elapsed, res.cpu, res.maxRSSKiB = t1.Sub(t0), cpu, rss
	var rows, distinct int
	if err := conn.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM "+schema+".bench_effects").Scan(&rows, &distinct); err != nil {
		return result{}, fmt.Errorf("count effects: %w", err)
	}
	res.delivered, res.duplicates = distinct, rows-distinct
	if distinct != n {
		res.note = fmt.Sprintf(" — %d of %d effects applied", distinct, n)
	}
	if rows != distinct {
		res.note += fmt.Sprintf(" — %d duplicate effects", rows-distinct)
	}
	return res, nil
}

// reportWAL returns the run's WAL bytes, saying when they are the cluster's (the server has no
// pg_walinspect to tell the schema's apart).
func reportWAL(f testenv.WALFigures) int64 {
	if !f.Attributed {
		fmt.Fprintln(os.Stderr, "    pg_walinspect unavailable: WAL figures are cluster-wide")
	}
	return f.Schema
}

// verifier reads a topic back from the start and records, for each distinct event, the time
// from its enqueue to its arrival at the verifier.
type verifier struct {
	cl        *kgo.Client
	want      int
	seen      map[int]struct{}
	latencies []time.Duration
	dups      int
	keyless   int
	first     time.Time
	last      time.Time
	done      chan struct{}
	cancel    context.CancelFunc
	// sentinels are the partitions whose sentinel record was read; live is closed once every
	// partition's (partitions) was.
	sentinels  map[int32]struct{}
	partitions int
	live       chan struct{}
}

// sentinelHeader marks the verifier's own records (newVerifier), which it does not count.
const sentinelHeader = "peers-sentinel"

// newVerifier starts reading topic, of partitions partitions, and returns once its fetches are
// live on every partition: it writes one sentinel record to each and waits until it has read
// them all. A verifier that returned before would read a run's first records when its first
// fetch of their partition came, up to a second after they were acknowledged (the client
// learning the new topic's leaders), and charge that to the contender that started first.
func newVerifier(ctx context.Context, brokers []string, topic string, partitions, want int) (*verifier, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("verifier client: %w", err)
	}
	lctx, cancel := context.WithCancel(context.Background())
	v := &verifier{cl: cl, want: want, seen: make(map[int]struct{}, want), latencies: make([]time.Duration, 0, want),
		done: make(chan struct{}), cancel: cancel,
		sentinels: make(map[int32]struct{}, partitions), partitions: partitions, live: make(chan struct{})}
	go v.loop(lctx)
	if err := writeSentinels(ctx, brokers, topic, partitions); err != nil {
		v.cancel()
		v.close()
		return nil, err
	}
	select {
	case <-v.live:
		return v, nil
	case <-time.After(30 * time.Second):
		err = fmt.Errorf("verifier: the sentinel records of %s were not read back within 30 s", topic)
	case <-ctx.Done():
		err = ctx.Err()
	}
	v.cancel()
	v.close()
	return nil, err
}

// writeSentinels writes one sentinel record to each of topic's partitions.
func writeSentinels(ctx context.Context, brokers []string, topic string, partitions int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return fmt.Errorf("sentinel producer: %w", err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, partitions)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(i), Headers: []kgo.RecordHeader{{Key: sentinelHeader}}}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("sentinel records: %w", err)
	}
	return nil
}

func (v *verifier) loop(ctx context.Context) {
	defer close(v.done)
	for len(v.seen) < v.want {
		fs := v.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			if len(r.Headers) == 1 && r.Headers[0].Key == sentinelHeader {
				if _, seen := v.sentinels[r.Partition]; !seen {
					v.sentinels[r.Partition] = struct{}{}
					if len(v.sentinels) == v.partitions {
						close(v.live)
					}
				}
				return
			}
			var s stamp
			if err := json.Unmarshal(r.Value, &s); err != nil {
				return
			}
			if _, dup := v.seen[s.N]; dup {
				v.dups++
				return
			}
			v.seen[s.N] = struct{}{}
			if len(r.Key) == 0 {
				v.keyless++
			}
			v.latencies = append(v.latencies, now.Sub(time.Unix(0, s.T)))
			if v.first.IsZero() {
				v.first = now
			}
			v.last = now
		})
	}
}

// wait returns when every event was seen, timeout passed or the contender exited (crashed:
// stop reports how); the verifier is stopped then.
func (v *verifier) wait(ctx context.Context, timeout time.Duration, exited <-chan struct{}) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-v.done:
	case <-exited:
	case <-t.C:
	case <-ctx.Done():
	}
	v.cancel()
	<-v.done
}

func (v *verifier) close() { v.cl.Close() }

func (v *verifier) result(name, scenario string, t0 time.Time, cpu time.Duration, rss int64) result {
	r := result{contender: name, scenario: scenario, want: v.want, delivered: len(v.seen), duplicates: v.dups,
		cpu: cpu, maxRSSKiB: rss}
	if !v.last.IsZero() {
		r.elapsed, r.streaming = v.last.Sub(t0), v.last.Sub(v.first)
	}
	slices.Sort(v.latencies)
	if n := len(v.latencies); n > 0 {
		r.p50 = v.latencies[n*50/100]
		r.p99 = v.latencies[min(n-1, n*99/100)]
	}
	if r.delivered < r.want {
		r.cut = true
		r.note = fmt.Sprintf(" — cut: %d of %d delivered", r.delivered, r.want)
	}
	if r.duplicates > 0 {
		r.note += fmt.Sprintf(" — %d duplicates on the topic", r.duplicates)
	}
	if v.keyless > 0 {
		r.note += fmt.Sprintf(" — %d records without a key", v.keyless)
	}
	return r
}

// printTable prints one scenario's results as Markdown: medians over runs per contender (with
// the msgs/s range when there are several runs), and the ratio of keiro's medians to each peer's.
func printTable(w io.Writer, scenario string, cs []contender, all []result) {
	type agg struct {
		rate, p50, p99, cpu, rss, enq float64
		streamRate, cpuMsg, wal       float64
		rateRange                     string
		notes                         []string
	}
	med := func(xs []float64) float64 {
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	aggs := map[string]agg{}
	for _, c := range cs {
		var rate, p50, p99, cpu, rss, enq, streamRate, cpuMsg, wal []float64
		var notes []string
		for _, r := range all {
			if r.scenario != scenario || r.contender != c.name {
				continue
			}
			rate = append(rate, r.rate())
			p50 = append(p50, r.p50.Seconds()*1000)
			p99 = append(p99, r.p99.Seconds()*1000)
			cpu = append(cpu, r.cpu.Seconds())
			rss = append(rss, float64(r.maxRSSKiB)/1024)
			enq = append(enq, r.enqueue.Seconds())
			streamRate = append(streamRate, r.streamingRate())
			cpuMsg = append(cpuMsg, float64(r.cpuPerMsg())/1e3)
			wal = append(wal, float64(r.walEnqueue+r.walRelay)/float64(max(1, r.want)))
			if n := strings.TrimPrefix(r.note, " — "); n != "" && !slices.Contains(notes, n) {
				notes = append(notes, n)
			}
		}
		if len(rate) > 0 {
			a := agg{rate: med(rate), p50: med(p50), p99: med(p99), cpu: med(cpu), rss: med(rss), enq: med(enq),
				streamRate: med(streamRate), cpuMsg: med(cpuMsg), wal: med(wal), notes: notes}
			if len(rate) > 1 { // rate is sorted by med
				a.rateRange = fmt.Sprintf(" (%.0f–%.0f)", rate[0], rate[len(rate)-1])
			}
			aggs[c.name] = a
		}
	}
	// Ratios are keiro's log mode to each peer when it ran, else the claim relay's.
	ours := "keiro"
	for _, n := range []string{"log", "keiro", "claim"} {
		if _, ok := aggs[n]; ok {
			ours = n
			break
		}
	}
	if scenario == "consume" {
		ours = "keiro-consumer"
	}
	fmt.Fprintf(w, "\n### %s\n\n", scenario)
	if scenario == "consume" {
		fmt.Fprintln(w, "| contender | msgs/s | CPU s | peak RSS MiB | ours/peer msgs/s | guarantee | notes |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---|---|")
	} else {
		fmt.Fprintf(w, "| contender | msgs/s | msgs/s first→last | p50 ms | p99 ms | CPU s | CPU µs/msg relay+PG+broker | peak RSS MiB | WAL B/event | %s/peer msgs/s | peer/%s p99 | enqueue s | notes |\n", ours, ours)
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	}
	o, haveOurs := aggs[ours]
	for _, c := range cs {
		a, ok := aggs[c.name]
		if !ok {
			continue
		}
		ratio, p99ratio := "—", "—"
		if haveOurs && c.name != ours && !strings.HasPrefix(c.name, "keiro") && a.rate > 0 {
			ratio = fmt.Sprintf("%.1f×", o.rate/a.rate)
			if o.p99 > 0 {
				p99ratio = fmt.Sprintf("%.1f×", a.p99/o.p99)
			}
		}
		notes := strings.Join(a.notes, "; ")
		if scenario == "consume" {
			fmt.Fprintf(w, "| %s | %.0f%s | %.2f | %.0f | %s | %s | %s |\n", c.name, a.rate, a.rateRange, a.cpu, a.rss, ratio, c.guarantee, notes)
		} else {
			enq := "—"
			if scenario == "drain" {
				enq = fmt.Sprintf("%.1f", a.enq)
			}
			fmt.Fprintf(w, "| %s | %.0f%s | %.0f | %.1f | %.1f | %.2f | %.0f | %.0f | %.0f | %s | %s | %s | %s |\n", c.name, a.rate, a.rateRange,
				a.streamRate, a.p50, a.p99, a.cpu, a.cpuMsg, a.rss, a.wal, ratio, p99ratio, enq, notes)
		}
	}
}

func printSettings(w io.Writer, only []string) {
	fmt.Fprintln(w, "\nSettings (each as its documentation recommends unless marked tuned):")
	for _, c := range contenders {
		if only == nil && c.optional || only != nil && !slices.Contains(only, c.name) {
			continue
		}
		fmt.Fprintf(w, "- **%s**: %s. Guarantee: %s.\n", c.name, c.settings, c.guarantee)
	}
}

func numCPU() int { return runtime.GOMAXPROCS(0) }
