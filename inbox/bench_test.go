package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The consumer benchmarks push b.N records through kfake → consumer → inbox → a one-row SQL
// handler, and report msgs/s from the first poll to the last offset commit. Run them with a
// fixed count so the figures are comparable:
//
//	go test -run XXX -bench 'Consumer|RawBatchedInsert' -benchtime 100000x ./inbox
//
// Under -short every benchmark stops at 10k records.
//
// BenchmarkRawBatchedInsert is the limit: the same effect rows inserted by a bare loop of
// batched INSERTs (unnest, 100 rows per transaction), no Kafka, no inbox. BenchmarkKafkaOnly
// and BenchmarkStoreOnly are the consumer's two parts alone (Kafka without PostgreSQL, the
// inbox without Kafka), to show where the time between the two goes. Each reports the CPU
// time of the benchmark's process per message (cpu-µs/msg: consumer, franz-go and the kfake
// broker; PostgreSQL's share is in its own processes).

const benchPartitions = 4

// benchSize is b.N, capped at 10k records under -short.
func benchSize(b *testing.B) int {
	if testing.Short() {
		return min(b.N, 10_000)
	}
	return b.N
}

func benchRecords(b *testing.B, n int, topic string, dupEvery int) []*kgo.Record {
	b.Helper()
	recs := make([]*kgo.Record, 0, n)
	var evs []envelope.Event
	for len(recs) < n {
		ev := newEvent("ordering", topic)
		k := fmt.Sprintf("key-%d", len(recs)%64)
		ev.Key = &k
		evs = append(evs, ev)
		recs = append(recs, toKgo(ev.Record(envelope.EncodeOptions{})))
		if dupEvery > 0 && len(recs) < n && len(evs)%dupEvery == 0 {
			// a redelivery of an earlier message, later in the stream
			old := evs[len(evs)/2]
			recs = append(recs, toKgo(old.Record(envelope.EncodeOptions{})))
		}
	}
	return recs
}

func benchConsumer(b *testing.B, batchSize int, dupEvery int, batchHandler bool) {
	benchConsumerWith(b, batchSize, dupEvery, batchHandler, inbox.DedupeOnly)
}

func benchConsumerWith(b *testing.B, batchSize int, dupEvery int, batchHandler bool, persistence inbox.Persistence) {
	db := testenv.NewDB(b)
	fx := newEffects(b, db)
	kc := testenv.BenchKafka(b, testenv.KafkaConfig{})
	topic := kc.Topic("bench.orders.v1")
	kc.CreateTopic(b, topic, benchPartitions)
	prod := kc.NewClient(b, kgo.ProducerBatchMaxBytes(1<<20))
	recs := benchRecords(b, benchSize(b), topic, dupEvery)
	for i := 0; i < len(recs); i += 5000 {
		produce(b, prod, recs[i:min(i+5000, len(recs))]...)
	}
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+fx.table+` (message_id, msg_key, payload) VALUES ($1, $2, $3)`,
			ev.MessageID, ev.Key, string(ev.Payload))
		return err
	}
	var bh inbox.BatchHandler
	if batchHandler {
		bh = fx.batchInsert
	}
	p := newProgress()
	c, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: kc.Group("bench"), Topics: []string{topic}, BatchSize: batchSize, BatchHandler: bh,
		Store:       inbox.StoreConfig{Schema: db.Schema, Persistence: persistence},
		OnCommitted: p.onCommitted, Logger: slog.New(slog.DiscardHandler),
		// The Kafka client's own fetch sizes, as a user gets them.
		KafkaOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
	}, h)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	m := startMeter(b)
	go func() { done <- c.Run(ctx) }()
	p.waitCommitted(b, topic, 1, time.Minute)
	first := time.Since(m.start)
	p.waitCommitted(b, topic, int64(len(recs)), 10*time.Minute)
	m.stop(b, len(recs))
	cancel()
	require.NoError(b, <-done)
	st := c.Stats()
	require.EqualValues(b, len(recs), st.Processed+st.Duplicates)
	b.ReportMetric(first.Seconds(), "s-to-first-commit")
}

// The defaults (group commit, full envelope), the per-event handler inserting one row each.
func BenchmarkConsumerDefaults(b *testing.B) { benchConsumerWith(b, 0, 0, false, inbox.FullEnvelope) }

// The defaults with a BatchHandler inserting a batch's rows in one statement (what the sql
// mode runs by default: SQL.HandleBatch pipelines a batch's calls in one round trip).
func BenchmarkConsumerDefaultsBatchHandler(b *testing.B) {
	benchConsumerWith(b, 0, 0, true, inbox.FullEnvelope)
}

// One inbox transaction per record, the handler inserting one row.
func BenchmarkConsumerSingle(b *testing.B) { benchConsumer(b, 1, 0, false) }

// 100 records per inbox transaction, the per-event handler inserting one row each.
func BenchmarkConsumerBatch(b *testing.B) { benchConsumer(b, 100, 0, false) }

// 100 records per inbox transaction, a BatchHandler inserting their rows in one statement.
func BenchmarkConsumerBatchHandler(b *testing.B) { benchConsumer(b, 100, 0, true) }

// Every other record is a redelivery of an earlier message (50% duplicates).
func BenchmarkConsumerSingleDuplicateHeavy(b *testing.B) { benchConsumer(b, 1, 1, false) }

func BenchmarkConsumerBatchDuplicateHeavy(b *testing.B) { benchConsumer(b, 100, 1, false) }

func BenchmarkConsumerBatchHandlerDuplicateHeavy(b *testing.B) { benchConsumer(b, 100, 1, true) }

func BenchmarkRawBatchedInsert(b *testing.B) {
	ctx := context.Background()
	db := testenv.NewDB(b)
	fx := newEffects(b, db)
	n := benchSize(b)
	ids, keys, payloads := effectRows(n)
	const batch = 100
	q := `INSERT INTO ` + fx.table + ` (message_id, msg_key, payload) SELECT * FROM unnest($1::text[], $2::text[], $3::text[])`
	m := startMeter(b)
	for i := 0; i < n; i += batch {
		j := min(i+batch, n)
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, q, ids[i:j], keys[i:j], payloads[i:j])
			return err
		})
		require.NoError(b, err)
	}
	m.stop(b, n)
}

// The two parts of the consumer's cost, each alone, in the same run as the others: where the
// gap between the defaults and RawBatchedInsert goes.

// BenchmarkKafkaOnly is the consumer's Kafka path without PostgreSQL: the same records polled
// from kfake by a group member with the client's default fetch options, decoded into envelopes
// (envelope.Decode), and their offsets committed once at the end. On this machine the broker
// (kfake) runs in the benchmark's process, so its CPU counts in cpu-µs/msg.
func BenchmarkKafkaOnly(b *testing.B) {
	kc := testenv.NewKafka(b)
	topic := "bench.orders.v1"
	kc.CreateTopic(b, topic, benchPartitions)
	prod := kc.NewClient(b, kgo.ProducerBatchMaxBytes(1<<20))
	recs := benchRecords(b, benchSize(b), topic, 0)
	for i := 0; i < len(recs); i += 5000 {
		produce(b, prod, recs[i:min(i+5000, len(recs))]...)
	}
	cl := kc.NewClient(b, kgo.ConsumerGroup("bench"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	m := startMeter(b)
	n := 0
	for n < len(recs) {
		fs := cl.PollRecords(ctx, 10_000)
		require.NoError(b, ctx.Err())
		fs.EachRecord(func(r *kgo.Record) {
			hs := make([]envelope.Header, len(r.Headers))
			for i, h := range r.Headers {
				hs[i] = envelope.Header{Key: h.Key, Value: h.Value}
			}
			_, err := envelope.Decode(envelope.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp})
			if err != nil {
				b.Fatal(err)
			}
			n++
		})
	}
	require.NoError(b, cl.CommitUncommittedOffsets(ctx))
	m.stop(b, n)
}

// BenchmarkStoreOnly is the consumer's PostgreSQL path without Kafka: the same deliveries
// (full envelopes) through Store.ProcessBatchWith in groups of DefaultBatchSize, from one
// goroutine per partition, each group's effect rows written by one INSERT as in
// ConsumerDefaultsBatchHandler: an inbox row and an effect row per message.
func BenchmarkStoreOnly(b *testing.B) {
	ctx := context.Background()
	db := testenv.NewDB(b)
	fx := newEffects(b, db)
	st, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "bench"})
	require.NoError(b, err)
	n := benchSize(b)
	parts := make([][]inbox.Delivery, benchPartitions)
	for i := range n {
		ev := newEvent("ordering", "bench.orders.v1")
		k := fmt.Sprintf("key-%d", i%64)
		ev.Key = &k
		p := i % benchPartitions
		parts[p] = append(parts[p], inbox.Delivery{Event: ev,
			Kafka: &inbox.KafkaRef{Topic: "bench.orders.v1", Partition: int32(p), Offset: int64(len(parts[p]))}})
	}
	m := startMeter(b)
	var wg sync.WaitGroup
	errs := make(chan error, benchPartitions)
	for _, ds := range parts {
		wg.Go(func() {
			for i := 0; i < len(ds); i += inbox.DefaultBatchSize {
				res, err := st.ProcessBatchWith(ctx, db.Pool, ds[i:min(i+inbox.DefaultBatchSize, len(ds))], fx.batchInsert)
				if err == nil && res[0].Outcome != inbox.Processed {
					err = fmt.Errorf("outcome %v", res[0].Outcome)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	m.stop(b, n)
	close(errs)
	require.NoError(b, <-errs)
}

// BenchmarkRawBatchedInsertDedupe is RawBatchedInsert plus the least an exactly-once consumer
// writes: in the same transaction, one row per message in a table whose primary key is the
// inbox's (consumer, source, dedupe key), inserted ON CONFLICT DO NOTHING; no envelope, no
// Kafka. Next to RawBatchedInsert it shows what the dedupe row itself costs.
func BenchmarkRawBatchedInsertDedupe(b *testing.B) {
	ctx := context.Background()
	db := testenv.NewDB(b)
	fx := newEffects(b, db)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Schema+`.dedupe (consumer text NOT NULL, source text NOT NULL,
		dedupe_key text NOT NULL, PRIMARY KEY (consumer, source, dedupe_key))`)
	require.NoError(b, err)
	n := benchSize(b)
	ids, keys, payloads := effectRows(n)
	const batch = 100
	dq := `INSERT INTO ` + db.Schema + `.dedupe (consumer, source, dedupe_key)
		SELECT 'bench', 'ordering', k FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING`
	q := `INSERT INTO ` + fx.table + ` (message_id, msg_key, payload) SELECT * FROM unnest($1::text[], $2::text[], $3::text[])`
	m := startMeter(b)
	for i := 0; i < n; i += batch {
		j := min(i+batch, n)
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, dq, ids[i:j]); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, q, ids[i:j], keys[i:j], payloads[i:j])
			return err
		})
		require.NoError(b, err)
	}
	m.stop(b, n)
}

// BenchmarkConsumerLatency offers b.N records at a steady 1000 msgs/s (over 4 partitions) to a
// consumer with the default configuration and reports the latency from the produce call to the
// commit of the inbox transaction that holds the record's effect (p50-ms, p99-ms, max-ms; the
// COMMIT's completion is observed with a pgx tracer), and to the following offset commit
// (offset-p99-ms). The producer does not linger. Run it with a fixed count:
//
//	go test -run XXX -bench ConsumerLatency -benchtime 5000x ./inbox
func BenchmarkConsumerLatency(b *testing.B) {
	const rate = 1000
	db := testenv.NewDB(b)
	fx := newEffects(b, db)
	kc := testenv.NewKafka(b)
	topic := "bench.latency.v1"
	kc.CreateTopic(b, topic, benchPartitions)
	prod := kc.NewClient(b, kgo.ProducerLinger(0))

	tr := &commitTracer{pending: map[*pgx.Conn][]string{}, committed: map[string]time.Time{}}
	pcfg, err := pgxpool.ParseConfig(db.ConnString)
	require.NoError(b, err)
	pcfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(b, err)
	defer pool.Close()
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+fx.table+` (message_id, msg_key, payload) VALUES ($1, $2, $3)`,
			ev.MessageID, ev.Key, string(ev.Payload)); err != nil {
			return err
		}
		tr.wrote(tx.Conn(), ev.MessageID)
		return nil
	}
	type commit struct {
		offset int64
		at     time.Time
	}
	var mu sync.Mutex
	commits := map[int32][]commit{}
	p := newProgress()
	c, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "bench", Topics: []string{topic},
		Store: inbox.StoreConfig{Schema: db.Schema},
		OnCommitted: func(cm inbox.Commit) {
			now := time.Now()
			mu.Lock()
			commits[cm.Partition] = append(commits[cm.Partition], commit{cm.Offset, now})
			mu.Unlock()
			p.onCommitted(cm)
		},
		Logger:    slog.New(slog.DiscardHandler),
		KafkaOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
	}, h)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	// Warm up: one record through, so the group is joined before the clock starts.
	produceEvents(b, prod, newEvent("ordering", topic))
	p.waitCommitted(b, topic, 1, time.Minute)

	n := benchSize(b)
	type sent struct {
		id        string
		partition int32
		offset    int64
		at        time.Time
	}
	sentc := make(chan sent, n)
	b.ResetTimer()
	tick := time.NewTicker(time.Second / rate)
	for i := 0; i < n; i++ {
		<-tick.C
		ev := newEvent("ordering", topic)
		k := fmt.Sprintf("key-%d", i%64)
		ev.Key = &k
		at := time.Now()
		prod.Produce(context.Background(), toKgo(ev.Record(envelope.EncodeOptions{})), func(r *kgo.Record, err error) {
			if err != nil {
				panic(err)
			}
			sentc <- sent{ev.MessageID, r.Partition, r.Offset, at}
		})
	}
	tick.Stop()
	p.waitCommitted(b, topic, int64(n+1), time.Minute)
	b.StopTimer()
	cancel()
	require.NoError(b, <-done)

	effect := make([]time.Duration, 0, n)
	offset := make([]time.Duration, 0, n)
	mu.Lock()
	tr.mu.Lock()
	for range n {
		s := <-sentc
		at, ok := tr.committed[s.id]
		require.True(b, ok, "effect of %s committed", s.id)
		effect = append(effect, at.Sub(s.at))
		for _, cm := range commits[s.partition] {
			if cm.offset > s.offset {
				offset = append(offset, cm.at.Sub(s.at))
				break
			}
		}
	}
	tr.mu.Unlock()
	mu.Unlock()
	require.Len(b, offset, n)
	slices.Sort(effect)
	slices.Sort(offset)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(effect[n/2]), "p50-ms")
	b.ReportMetric(ms(effect[n*99/100]), "p99-ms")
	b.ReportMetric(ms(effect[n-1]), "max-ms")
	b.ReportMetric(ms(offset[n*99/100]), "offset-p99-ms")
	b.ReportMetric(0, "ns/op")
}

// commitTracer notes when the transaction that wrote each message's effect committed.
type commitTracer struct {
	mu        sync.Mutex
	pending   map[*pgx.Conn][]string
	committed map[string]time.Time
}

type sqlKey struct{}

func (t *commitTracer) wrote(conn *pgx.Conn, id string) {
	t.mu.Lock()
	t.pending[conn] = append(t.pending[conn], id)
	t.mu.Unlock()
}

func (t *commitTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, data.SQL)
}

func (t *commitTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	q, _ := ctx.Value(sqlKey{}).(string)
	if q != "commit" && q != "rollback" {
		return
	}
	now := time.Now()
	t.mu.Lock()
	if q == "commit" && data.Err == nil {
		for _, id := range t.pending[conn] {
			t.committed[id] = now
		}
	}
	delete(t.pending, conn)
	t.mu.Unlock()
}

// effectRows returns the columns of n effect rows for the raw loops.
func effectRows(n int) (ids, keys, payloads []string) {
	ids, keys, payloads = make([]string, n), make([]string, n), make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("msg-%d-%s", i, envelope.NewUUIDv7())
		keys[i] = fmt.Sprintf("key-%d", i%64)
		payloads[i] = fmt.Sprintf(`{"n":%d}`, i)
	}
	return ids, keys, payloads
}

// batchInsert is a BatchHandler writing one effect row per event with one INSERT per batch.
func (e *effects) batchInsert(ctx context.Context, tx pgx.Tx, evs []envelope.Event) error {
	ids, keys, payloads := make([]string, len(evs)), make([]*string, len(evs)), make([]string, len(evs))
	for i, ev := range evs {
		ids[i], keys[i], payloads[i] = ev.MessageID, ev.Key, string(ev.Payload)
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+e.table+` (message_id, msg_key, payload)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[])`, ids, keys, payloads)
	return err
}

// meter measures a benchmark's timed part: from startMeter (which resets the benchmark
// timer) to stop, which reports msgs/s and the process's CPU per message (cpu-µs/msg).
type meter struct {
	start time.Time
	cpu0  time.Duration
}

func startMeter(b *testing.B) meter {
	b.ResetTimer()
	return meter{start: time.Now(), cpu0: processCPU()}
}

func (m meter) stop(b *testing.B, n int) {
	elapsed, cpu := time.Since(m.start), processCPU()-m.cpu0
	b.StopTimer()
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/msg")
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op")
}

// processCPU is the CPU time (user and system) this test process has used so far: the
// benchmarks report it per message (cpu-µs/msg), the client side of the cost; PostgreSQL's
// side runs in other processes.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
