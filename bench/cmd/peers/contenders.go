package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/logrelay"
)

const (
	// forwarderTopic is the Watermill SQL "topic" (table) the Forwarder subscribes to.
	forwarderTopic = "forwarder_topic"
	// watermillUUIDHeader is watermill-kafka's message uuid header (kafka.UUIDHeaderKey).
	watermillUUIDHeader = kafka.UUIDHeaderKey
	// metadataKey carries the record key in Watermill metadata for the partitioning marshaler.
	metadataKey = "partition_key"
)

// --- keiro relay ---

func enqueueKeiro(ctx context.Context, tx pgx.Tx, schema, topic string, msgs []msg) error {
	store, err := outbox.NewStore(schema)
	if err != nil {
		return err
	}
	_, err = store.EnqueueTx(ctx, tx, keiroEvents(topic, msgs)...)
	return err
}

// emitKeiro is enqueueKeiro through Store.EmitTx (log mode's logical decoding messages).
func emitKeiro(ctx context.Context, tx pgx.Tx, schema, topic string, msgs []msg) error {
	store, err := outbox.NewStore(schema)
	if err != nil {
		return err
	}
	return store.EmitTx(ctx, tx, keiroEvents(topic, msgs)...)
}

// keiroEvents are msgs as the events keiro's contenders enqueue to topic.
func keiroEvents(topic string, msgs []msg) []envelope.Event {
	evs := make([]envelope.Event, len(msgs))
	now := time.Now().UTC()
	for i := range msgs {
		evs[i] = envelope.Event{MessageID: "m-" + strconv.Itoa(msgs[i].n), Source: "bench", Destination: topic,
			Key: &msgs[i].key, EventType: "OrderPlaced", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
			Payload: msgs[i].payload, OccurredAt: now}
	}
	return evs
}

func runKeiroRelay(ctx context.Context, o options, pool *pgxpool.Pool, mode outbox.Mode, batchSize, inFlight, claimers int) error {
	opts := append(outbox.ProducerOpts(), kgo.SeedBrokers(strings.Split(o.childBrokers, ",")...))
	extra, err := experimentOpts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(opts, extra...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	defer printProduceStats()
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("PEERS_DEBUG") != "" { // the relay's debug log (claims, produce times) on stderr
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg := outbox.RelayConfig{Schema: o.childSchema, Logger: logger, BatchSize: batchSize,
		MaxInFlightBatches: inFlight, ClaimConcurrency: claimers, Mode: mode}
	if mode == outbox.ModeLog {
		cfg.LogEngine = logrelay.Engine
	}
	relay, err := outbox.NewRelay(pool, cl, cfg)
	if err != nil {
		return err
	}
	ready()
	return relay.Run(ctx)
}

// --- Watermill Forwarder ---

// watermillAdapters returns the default PostgreSQL schema and offsets adapters with their
// tables placed in schema (the only change from the defaults besides batchSize).
func watermillAdapters(schema string, batchSize int) (wsql.DefaultPostgreSQLSchema, wsql.DefaultPostgreSQLOffsetsAdapter) {
	return wsql.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: func(topic string) string { return fmt.Sprintf(`%s."watermill_%s"`, schema, topic) },
			SubscribeBatchSize:        batchSize,
		}, wsql.DefaultPostgreSQLOffsetsAdapter{
			GenerateMessagesOffsetsTableName: func(topic string) string {
				return fmt.Sprintf(`%s."watermill_offsets_%s"`, schema, topic)
			},
		}
}

func initWatermillTables(ctx context.Context, dsn, schema string) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	sa, oa := watermillAdapters(schema, 0)
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{SchemaAdapter: sa, OffsetsAdapter: oa,
		InitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("watermill subscriber: %w", err)
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(forwarderTopic); err != nil {
		return fmt.Errorf("initialize watermill tables: %w", err)
	}
	return nil
}

func enqueueWatermill(ctx context.Context, tx pgx.Tx, schema, topic string, msgs []msg) error {
	sa, _ := watermillAdapters(schema, 0)
	pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: sa}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	fp := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic})
	wms := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		wms[i] = message.NewMessage(watermill.NewUUID(), m.payload)
		wms[i].Metadata.Set(metadataKey, m.key)
		wms[i].SetContext(ctx)
	}
	return fp.Publish(topic, wms...)
}

func runWatermillForwarder(ctx context.Context, o options, pool *pgxpool.Pool, tuned bool) error {
	logger := watermill.NopLogger{}
	batch := 0 // DefaultPostgreSQLSchema's default: 100
	subCfg := wsql.SubscriberConfig{}
	pubCfg := kafka.PublisherConfig{Brokers: strings.Split(o.childBrokers, ","), Marshaler: kafka.DefaultMarshaler{}}
	if tuned {
		batch = 1000
		subCfg.PollInterval = 10 * time.Millisecond
		sc := kafka.DefaultSaramaSyncPublisherConfig()
		sc.Version = sarama.V3_6_0_0
		pubCfg.OverwriteSaramaConfig = sc
		pubCfg.Marshaler = kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return m.Metadata.Get(metadataKey), nil
		})
	}
	subCfg.SchemaAdapter, subCfg.OffsetsAdapter = watermillAdapters(o.childSchema, batch)
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), subCfg, logger)
	if err != nil {
		return fmt.Errorf("watermill sql subscriber: %w", err)
	}
	pub, err := kafka.NewPublisher(pubCfg, logger)
	if err != nil {
		return fmt.Errorf("watermill kafka publisher: %w", err)
	}
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: forwarderTopic})
	if err != nil {
		return fmt.Errorf("watermill forwarder: %w", err)
	}
	ready()
	runErr := fwd.Run(ctx)
	return errors.Join(runErr, fwd.Close(), pub.Close())
}

// --- the minimal SKIP LOCKED loop ---

func skipLockedDDL(schema string) string {
	return `CREATE TABLE ` + schema + `.bench_outbox (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		topic text NOT NULL, key text, payload bytea NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), sent_at timestamptz);
	CREATE INDEX ON ` + schema + `.bench_outbox (id) WHERE sent_at IS NULL;
	`
}

func enqueueSkipLocked(ctx context.Context, tx pgx.Tx, schema, topic string, msgs []msg) error {
	keys, payloads := make([]string, len(msgs)), make([][]byte, len(msgs))
	for i, m := range msgs {
		keys[i], payloads[i] = m.key, m.payload
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.bench_outbox (topic, key, payload)
		SELECT $1, k, p FROM unnest($2::text[], $3::bytea[]) AS u(k, p)`, topic, keys, payloads)
	return err
}

// skipLockedBatch and skipLockedPoll are the loop's settings (typical values of hand-written relays).
const (
	skipLockedBatch = 100
	skipLockedPoll  = 100 * time.Millisecond
)

func runSkipLocked(ctx context.Context, o options, pool *pgxpool.Pool) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(o.childBrokers, ",")...))
	if err != nil {
		return err
	}
	defer cl.Close()
	claim := `SELECT id, topic, key, payload FROM ` + o.childSchema + `.bench_outbox
		WHERE sent_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`
	mark := `UPDATE ` + o.childSchema + `.bench_outbox SET sent_at = now() WHERE id = ANY($1)`
	ready()
	for ctx.Err() == nil {
		n, err := skipLockedOnce(ctx, pool, cl, claim, mark)
		if err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "skiplocked:", err)
		}
		if n == 0 || err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(skipLockedPoll):
			}
		}
	}
	return nil
}

func skipLockedOnce(ctx context.Context, pool *pgxpool.Pool, cl *kgo.Client, claim, mark string) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, claim, skipLockedBatch)
		if err != nil {
			return err
		}
		var ids []int64
		var recs []*kgo.Record
		for rows.Next() {
			var id int64
			var topic string
			var key *string
			var payload []byte
			if err := rows.Scan(&id, &topic, &key, &payload); err != nil {
				return err
			}
			r := &kgo.Record{Topic: topic, Value: payload}
			if key != nil {
				r.Key = []byte(*key)
			}
			ids, recs = append(ids, id), append(recs, r)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n = len(recs); n == 0 {
			return nil
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		_, err = tx.Exec(ctx, mark, ids)
		return err
	})
	return n, err
}

// --- consumers ---

func effectsDDL(schema string) string {
	// No primary key: a duplicate effect must be visible as a second row.
	return `CREATE TABLE ` + schema + `.bench_effects (id text NOT NULL, payload bytea NOT NULL);`
}

// runKeiroConsumer runs keiro's consumer with a handler that INSERTs each record's effect in
// the inbox transaction, or, batched, a BatchHandler that INSERTs a batch's effects in one
// statement (its round trips do not grow with the batch).
func runKeiroConsumer(ctx context.Context, o options, pool *pgxpool.Pool, batchSize int, batched bool) error {
	insert := `INSERT INTO ` + o.childSchema + `.bench_effects (id, payload) VALUES ($1, $2)`
	insertMany := `INSERT INTO ` + o.childSchema + `.bench_effects (id, payload) SELECT * FROM unnest($1::text[], $2::bytea[])`
	var committed atomic.Int64
	var once sync.Once
	cfg := inbox.ConsumerConfig{
		Brokers: strings.Split(o.childBrokers, ","), Group: o.childGroup, Topics: []string{o.childTopic},
		Store: inbox.StoreConfig{Schema: o.childSchema}, BatchSize: batchSize, Logger: slog.New(slog.DiscardHandler),
		OnCommitted: func(cm inbox.Commit) {
			if committed.Add(int64(cm.Records)) >= int64(o.childExpect) {
				once.Do(func() { fmt.Println("done") })
			}
		},
	}
	if batched {
		cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, evs []envelope.Event) error {
			ids, payloads := make([]string, len(evs)), make([][]byte, len(evs))
			for i, ev := range evs {
				ids[i], payloads[i] = ev.MessageID, ev.Payload
			}
			_, err := tx.Exec(ctx, insertMany, ids, payloads)
			return err
		}
	}
	c, err := inbox.NewConsumer(pool, cfg, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		_, err := tx.Exec(ctx, insert, ev.MessageID, ev.Payload)
		return err
	})
	if err != nil {
		return err
	}
	ready()
	return c.Run(ctx)
}

func runWatermillConsumer(ctx context.Context, o options, pool *pgxpool.Pool, byUUID bool) error {
	logger := watermill.NopLogger{}
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: strings.Split(o.childBrokers, ","),
		Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc, ConsumerGroup: o.childGroup}, logger)
	if err != nil {
		return fmt.Errorf("watermill kafka subscriber: %w", err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	// Count every message that leaves the deduplicator (handled or dropped as a duplicate), so
	// that the run ends even if the deduplicator drops distinct messages.
	var handled atomic.Int64
	var once sync.Once
	d := &middleware.Deduplicator{}
	if byUUID { // key on the message uuid instead of a 32-bit hash of the payload
		d.KeyFactory = func(m *message.Message) (string, error) { return m.UUID, nil }
	}
	dedup := d.Middleware
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		inner := dedup(h)
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := inner(m)
			if err == nil && handled.Add(1) >= int64(o.childExpect) {
				once.Do(func() { fmt.Println("done") })
			}
			return out, err
		}
	})
	insert := `INSERT INTO ` + o.childSchema + `.bench_effects (id, payload) VALUES ($1, $2)`
	router.AddConsumerHandler("effects", o.childTopic, sub, func(m *message.Message) error {
		_, err := pool.Exec(m.Context(), insert, m.UUID, []byte(m.Payload))
		return err
	})
	go func() {
		<-router.Running()
		ready()
	}()
	runErr := router.Run(ctx)
	return errors.Join(runErr, router.Close())
}

// --- child entry point ---

func ready() { fmt.Println("ready") }

// runChild runs one contender until its stdin closes (the parent's stop signal).
func runChild(ctx context.Context, o options) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString(0) // returns at EOF
		cancel()
	}()
	// The parent finds this process's PostgreSQL backends by their application_name when a
	// proxy hides the client ports (-net-latency): name them in the URL itself, which the
	// log-mode relay's replication connection is opened with too (keiro's relay names its own
	// sessions .../<pid> as well).
	if u, err := url.Parse(o.dsn); err == nil && u.Scheme != "" && u.Query().Get("application_name") == "" {
		q := u.Query()
		q.Set("application_name", fmt.Sprintf("keiro-peers/%d", os.Getpid()))
		u.RawQuery = q.Encode()
		o.dsn = u.String()
	}
	cfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(o.maxConnsChild)
	if d := os.Getenv("PEERS_AUTO_EXPLAIN"); d != "" {
		// Diagnostics: log the plans of this contender's slow statements (at least d, e.g.
		// "500ms") with their actual row counts to the PostgreSQL server log. Superuser only.
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "LOAD 'auto_explain'; SET auto_explain.log_analyze = on; "+
				"SET auto_explain.log_min_duration = '"+d+"'")
			return err
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var runErr error
	switch o.child {
	case "keiro", "claim":
		runErr = runKeiroRelay(ctx, o, pool, outbox.ModeClaim, 0, 0, 0)
	case "log", "log-emit":
		runErr = runKeiroRelay(ctx, o, pool, outbox.ModeLog, 0, 0, 0)
	case "keiro-b2048":
		runErr = runKeiroRelay(ctx, o, pool, outbox.ModeClaim, 2048, 0, 0)
	case "keiro-if1":
		runErr = runKeiroRelay(ctx, o, pool, outbox.ModeClaim, 0, 1, 0)
	case "keiro-c1":
		runErr = runKeiroRelay(ctx, o, pool, outbox.ModeClaim, 0, 0, 1)
	case "watermill-default":
		runErr = runWatermillForwarder(ctx, o, pool, false)
	case "watermill-tuned":
		runErr = runWatermillForwarder(ctx, o, pool, true)
	case "skiplocked":
		runErr = runSkipLocked(ctx, o, pool)
	case "keiro-consumer":
		runErr = runKeiroConsumer(ctx, o, pool, 0, false)
	case "keiro-consumer-b100":
		runErr = runKeiroConsumer(ctx, o, pool, 100, false)
	case "keiro-consumer-batch":
		runErr = runKeiroConsumer(ctx, o, pool, 0, true)
	case "watermill-consumer":
		runErr = runWatermillConsumer(ctx, o, pool, false)
	case "watermill-consumer-uuid":
		runErr = runWatermillConsumer(ctx, o, pool, true)
	default:
		return fmt.Errorf("unknown contender %q", o.child)
	}
	if errors.Is(runErr, context.Canceled) {
		runErr = nil
	}
	fmt.Printf("hwm %d\n", vmHWM())
	return runErr
}
