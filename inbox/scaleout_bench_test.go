package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
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

// BenchmarkConsumersScaleOut runs 1, 2 and 4 consumers of one group (each with its own pool and
// Kafka client, as in separate processes, with the defaults and the per-record handler of
// BenchmarkConsumerDefaults) over one backlog of b.N records (200 000 for the figures) over
// 10 000 keys on 12 partitions, produced before the consumers start, and reports what a
// message cost the machine: cpu-us/msg is this process (the consumers and the in-process
// kfake; KEIRO_BENCH_KAFKA=real moves the broker out of it) and the PostgreSQL processes
// serving it (testenv.CPUMeter), pg-cpu-us/msg PostgreSQL's part, bound-msgs/s the rate that
// CPU allows on the machine's cores, and redelivered/msg the records a consumer handled again
// after a rebalance moved their partition (the inbox skips them as duplicates). The clock
// runs from the consumers' start (their joins and the rebalances they cause included) to the
// last offset committed.
//
//	go test ./inbox/ -run XXX -bench ConsumersScaleOut -benchtime 200000x
func BenchmarkConsumersScaleOut(b *testing.B) {
	for _, consumers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("consumers-%d", consumers), func(b *testing.B) {
			benchConsumersScaleOut(b, consumers)
		})
	}
}

func benchConsumersScaleOut(b *testing.B, consumers int) {
	const partitions, keys = 12, 10_000
	b.StopTimer()
	db := testenv.NewDB(b)
	fx := newEffects(b, db)
	kc := testenv.BenchKafka(b, testenv.KafkaConfig{})
	topic := kc.Topic("bench.scaleout.v1")
	kc.CreateTopic(b, topic, partitions)
	prod := kc.NewClient(b, kgo.ProducerBatchMaxBytes(1<<20))
	n := benchSize(b)
	recs := make([]*kgo.Record, 0, n)
	for i := range n {
		ev := newEvent("ordering", topic)
		k := fmt.Sprintf("customer-%d", i%keys)
		ev.Key = &k
		recs = append(recs, toKgo(ev.Record(envelope.EncodeOptions{})))
	}
	for i := 0; i < len(recs); i += 5000 {
		produce(b, prod, recs[i:min(i+5000, len(recs))]...)
	}

	appName := "keiro-bench-consumers"
	h := func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+fx.table+` (message_id, msg_key, payload) VALUES ($1, $2, $3)`,
			ev.MessageID, ev.Key, string(ev.Payload))
		return err
	}
	p := newProgress()
	group := kc.Group("scaleout")
	cs := make([]*inbox.Consumer, consumers)
	pools := make([]*pgxpool.Pool, consumers)
	for i := range cs {
		pc, err := pgxpool.ParseConfig(db.ConnString)
		require.NoError(b, err)
		pc.ConnConfig.RuntimeParams["application_name"] = appName
		pools[i], err = pgxpool.NewWithConfig(context.Background(), pc)
		require.NoError(b, err)
		cs[i], err = inbox.NewConsumer(pools[i], inbox.ConsumerConfig{
			Brokers: kc.Seeds, Group: group, Topics: []string{topic},
			Store:       inbox.StoreConfig{Schema: db.Schema, Persistence: inbox.FullEnvelope},
			OnCommitted: p.onCommitted, Logger: slog.New(slog.DiscardHandler),
			KafkaOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
		}, h)
		require.NoError(b, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, consumers)
	m := testenv.StartCPU(b, db, appName)
	b.StartTimer()
	for _, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- c.Run(ctx) }()
	}
	p.waitCommitted(b, topic, int64(n), 10*time.Minute)
	b.StopTimer()
	f := m.Stop(b)
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}
	var handled, processed int64
	for i, c := range cs {
		st := c.Stats()
		handled += st.Processed + st.Duplicates
		processed += st.Processed
		pools[i].Close()
	}
	require.EqualValues(b, n, processed, "each record's effect applied once")
	var effects int
	require.NoError(b, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+fx.table).Scan(&effects))
	require.Equal(b, n, effects)
	b.ReportMetric(float64(n)/f.Elapsed.Seconds(), "msgs/s")
	b.ReportMetric(f.PerMessage(n), "cpu-us/msg")
	b.ReportMetric(f.PostgresPerMessage(n), "pg-cpu-us/msg")
	b.ReportMetric(f.BoundRate(n), "bound-msgs/s")
	b.ReportMetric(f.MachineBusyPercent(), "machine-busy-%")
	b.ReportMetric(float64(handled-int64(n))/float64(n), "redelivered/msg")
	b.ReportMetric(0, "ns/op")
}
