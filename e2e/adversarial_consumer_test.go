package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/schema"
)

// Kafka records through every handler mode and format of the consumer: the go handler (the
// inbox library, in process), the binary's sql mode, its http mode in each format, and Avro
// payloads through a schema registry. Each bad record (keys, values and headers missing,
// duplicated, binary, non-UTF-8, oversize) is produced with a raw client and followed, on the
// same partition, by a good keiro record.

// consumerCase is one bad record. The value of every keiro-message-id header it carries holds
// tag(i), so that an event the handler received is found again; a good record's id is good(i).
type consumerCase struct {
	Name    string
	Key     []byte // nil: no key
	Value   []byte
	Headers []kgo.RecordHeader
	// MustDeadLetter: the record can never be handled (no envelope, an unknown schema): it must
	// be dead-lettered, not handed over.
	MustDeadLetter bool
}

func (c consumerCase) String() string {
	var hs []string
	for _, h := range c.Headers {
		hs = append(hs, shown(h.Key)+"="+shown(h.Value))
	}
	return fmt.Sprintf("%s: key=%s value=%s headers=[%s]", c.Name, shown(c.Key), shown(c.Value), strings.Join(hs, " "))
}

var (
	badTagRe  = regexp.MustCompile(`q(\d{4})q`)
	goodTagRe = regexp.MustCompile(`good(\d{4})`)
)

func good(i int) string { return fmt.Sprintf("good%04d", i) }

// validHeaders are a good keiro record's headers for message id.
func validHeaders(id string) []kgo.RecordHeader {
	ev := envelope.Event{MessageID: id, Source: "adv", Destination: "adv", EventType: "Counted", SchemaVersion: 1,
		ContentType: envelope.ContentTypeJSON, OccurredAt: time.Now().UTC().Truncate(time.Microsecond)}
	var out []kgo.RecordHeader
	for _, h := range ev.Headers() {
		out = append(out, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	return out
}

// setHeader replaces the value of every header named key (adds one if there is none).
func setHeader(hs []kgo.RecordHeader, key string, v []byte) []kgo.RecordHeader {
	found := false
	for i := range hs {
		if hs[i].Key == key {
			hs[i].Value, found = v, true
		}
	}
	if !found {
		hs = append(hs, kgo.RecordHeader{Key: key, Value: v})
	}
	return hs
}

func dropHeader(hs []kgo.RecordHeader, key string) []kgo.RecordHeader {
	out := hs[:0]
	for _, h := range hs {
		if h.Key != key {
			out = append(out, h)
		}
	}
	return out
}

// fixedConsumerCases are the nasty records every run tries (the tag is added to the message id
// when the case is numbered).
func fixedConsumerCases() []consumerCase {
	with := func(name string, f func(c *consumerCase)) consumerCase {
		c := consumerCase{Name: name, Key: []byte("k-" + name), Value: []byte(`{"seq":0}`), Headers: validHeaders("")}
		f(&c)
		return c
	}
	return []consumerCase{
		with("no headers, no key, no value", func(c *consumerCase) { c.Key, c.Value, c.Headers, c.MustDeadLetter = nil, nil, nil, true }),
		with("not an event", func(c *consumerCase) { c.Headers, c.Value, c.MustDeadLetter = nil, []byte("not an event"), true }),
		with("no message id", func(c *consumerCase) {
			c.Headers, c.MustDeadLetter = dropHeader(c.Headers, envelope.HeaderMessageID), true
		}),
		with("no source", func(c *consumerCase) {
			c.Headers, c.MustDeadLetter = dropHeader(c.Headers, envelope.HeaderSource), true
		}),
		with("schema version not a number", func(c *consumerCase) {
			c.Headers, c.MustDeadLetter = setHeader(c.Headers, envelope.HeaderSchemaVersion, []byte("one")), true
		}),
		with("message id with a newline", func(c *consumerCase) {
			c.Headers = setHeader(c.Headers, envelope.HeaderMessageID, []byte("bad\nid-1"))
		}),
		with("message id with control characters and non-UTF-8", func(c *consumerCase) {
			c.Headers = setHeader(c.Headers, envelope.HeaderMessageID, []byte("\x01\x7f\xff\xfe"))
		}),
		with("binary key", func(c *consumerCase) { c.Key = []byte{0xde, 0xad, 0x00, 0xff} }),
		with("key with a newline", func(c *consumerCase) { c.Key = []byte("k\r\nX-Injected: 1") }),
		with("empty key", func(c *consumerCase) { c.Key = []byte{} }),
		with("10 KB key", func(c *consumerCase) { c.Key = []byte(repeatTo("k", 10<<10)) }),
		with("source and type with control characters", func(c *consumerCase) {
			c.Headers = setHeader(c.Headers, envelope.HeaderSource, []byte("src\r\n\x01"))
			c.Headers = setHeader(c.Headers, envelope.HeaderEventType, []byte("T\x00\x1b"))
		}),
		with("content type with a newline", func(c *consumerCase) {
			c.Headers = setHeader(c.Headers, envelope.HeaderContentType, []byte("application/json\r\nX: y"))
		}),
		with("duplicated headers", func(c *consumerCase) {
			c.Headers = append(c.Headers, validHeaders("")...)
			c.Headers = append(c.Headers, kgo.RecordHeader{Key: envelope.HeaderSource, Value: []byte{0xff}})
		}),
		with("JSON content type, binary value", func(c *consumerCase) { c.Value = []byte{0, 0xff, 0xfe, 0x80} }),
		with("nil value", func(c *consumerCase) { c.Value = nil }),
		with("oversize value", func(c *consumerCase) { c.Value = []byte(`"` + repeatTo("v", 512<<10) + `"`) }),
		with("oversize header", func(c *consumerCase) {
			c.Headers = append(c.Headers, kgo.RecordHeader{Key: "x-junk", Value: []byte(repeatTo("h\x01", 64<<10))})
		}),
		with("binary header name", func(c *consumerCase) {
			c.Headers = append(c.Headers, kgo.RecordHeader{Key: "\x00\xff\n", Value: []byte{0xff}})
		}),
		with("CloudEvents headers only, binary partition key", func(c *consumerCase) {
			c.Headers = []kgo.RecordHeader{{Key: envelope.HeaderCESpecVersion, Value: []byte("1.0")},
				{Key: envelope.HeaderCEID}, {Key: envelope.HeaderCESource, Value: []byte("src\n")},
				{Key: envelope.HeaderCEType, Value: []byte("T")}, {Key: envelope.HeaderContentType, Value: []byte("application/json")},
				{Key: envelope.HeaderCEPartitionKey, Value: []byte{0xff, 0}}}
			c.Key = []byte{1, 2, 3, 0xff}
		}),
		with("attributes not JSON", func(c *consumerCase) {
			c.Headers = setHeader(c.Headers, envelope.HeaderAttributes, []byte("{not json"))
		}),
		with("junk trace context", func(c *consumerCase) {
			c.Headers = setHeader(c.Headers, envelope.HeaderTraceparent, []byte("00-\n-\xff"))
			c.Headers = setHeader(c.Headers, envelope.HeaderTracestate, []byte("a=\x01"))
		}),
	}
}

// keiroHeaderNames are the headers a generated case mutates.
var keiroHeaderNames = []string{envelope.HeaderMessageID, envelope.HeaderSource, envelope.HeaderDestination,
	envelope.HeaderEventType, envelope.HeaderSchemaVersion, envelope.HeaderContentType, envelope.HeaderOccurredAt,
	envelope.HeaderAttributes, envelope.HeaderTraceparent, envelope.HeaderCausationID, envelope.HeaderSchemaID}

// junkValue generates a header value or key: empty, junk text, any bytes, or oversize.
var junkValue = rapid.OneOf(
	rapid.Just([]byte{}),
	rapid.Map(junkText(16), func(s string) []byte { return []byte(s) }),
	junkBytes(16),
	rapid.Map(rapid.IntRange(1, 4), func(n int) []byte { return []byte(repeatTo("ж\x01", n<<10)) }),
)

// consumerCaseGen generates bad records: a keiro record whose headers are dropped, duplicated
// or replaced by junk, with a junk key and value.
var consumerCaseGen = rapid.Custom(func(t *rapid.T) consumerCase {
	c := consumerCase{Name: "generated", Headers: validHeaders("")}
	for _, name := range keiroHeaderNames {
		switch rapid.IntRange(0, 5).Draw(t, name) {
		case 0:
			c.Headers = dropHeader(c.Headers, name)
		case 1:
			c.Headers = append(c.Headers, kgo.RecordHeader{Key: name, Value: junkValue.Draw(t, name+" duplicate")})
		case 2:
			c.Headers = setHeader(c.Headers, name, junkValue.Draw(t, name+" value"))
		}
	}
	if rapid.Bool().Draw(t, "extra header") {
		c.Headers = append(c.Headers, kgo.RecordHeader{Key: string(junkBytes(8).Draw(t, "extra name")), Value: junkValue.Draw(t, "extra value")})
	}
	switch rapid.IntRange(0, 3).Draw(t, "key kind") {
	case 0:
		c.Key = nil
	case 1:
		c.Key = []byte(repeatTo("k", sizeOf(t, "key size")))
	default:
		c.Key = junkValue.Draw(t, "key")
	}
	switch rapid.IntRange(0, 4).Draw(t, "value kind") {
	case 0:
		c.Value = nil
	case 1:
		c.Value = []byte(`{"seq":1}`)
	case 2:
		c.Value = []byte(`"` + repeatTo("v", 256<<10) + `"`)
	default:
		c.Value = junkBytes(32).Draw(t, "value")
	}
	return c
})

// tagged puts tag(i) in front of every keiro-message-id value of c.
func (c consumerCase) tagged(i int) consumerCase {
	hs := make([]kgo.RecordHeader, len(c.Headers))
	copy(hs, c.Headers)
	for j := range hs {
		if hs[j].Key == envelope.HeaderMessageID || hs[j].Key == envelope.HeaderCEID {
			hs[j].Value = append([]byte(tag(i)), hs[j].Value...)
		}
	}
	c.Headers = hs
	return c
}

// goodKey is the key of the good record behind a case: the bad record's own key when a keiro
// record can carry it (text, no NUL, not long), else one of its own.
func goodKey(c consumerCase, i int) []byte {
	if len(c.Key) > 0 && len(c.Key) < 1024 && utf8.Valid(c.Key) && !strings.ContainsRune(string(c.Key), 0) {
		return c.Key
	}
	return []byte(fmt.Sprintf("k%04d", i))
}

// delivered is one event a handler received: the case it belongs to (bad or good) and where.
type delivered struct {
	bad, good int // case index, or -1
	what      string
}

// classify finds which item an event is from its identifying text (message id, request).
func classify(text string) delivered {
	d := delivered{bad: -1, good: -1, what: shown(text)}
	if m := badTagRe.FindStringSubmatch(text); m != nil {
		d.bad, _ = strconv.Atoi(m[1])
	} else if m := goodTagRe.FindStringSubmatch(text); m != nil {
		d.good, _ = strconv.Atoi(m[1])
	}
	return d
}

// adversarialConsumer is the setup of the consumer boundaries: a topic with one partition per
// case up to maxCasePartitions (case i's bad record and the good record behind it on partition
// i mod maxCasePartitions, so that a case that holds up its partition holds up few others and
// failing cases show side by side), its dead-letter topic, and the check.
type adversarialConsumer struct {
	t          *testing.T
	db         *testenv.DB
	kc         *testenv.Kafka
	topic, dlq string
	group      string
	cases      []consumerCase
	partitions int
	badAt      map[[2]int64]int // (partition, offset) of a case's bad record -> case
	goodAt     map[[2]int64]int
	produced   map[int32]int64 // records per partition
}

// maxCasePartitions bounds the partitions of the consumer boundaries' topic.
const maxCasePartitions = 64

func newAdversarialConsumer(t *testing.T, kc *testenv.Kafka, cases []consumerCase) *adversarialConsumer {
	a := &adversarialConsumer{t: t, db: testenv.NewDB(t), kc: kc, topic: kc.Topic("adv.in"), group: kc.Group("adv"),
		partitions: min(len(cases), maxCasePartitions), badAt: map[[2]int64]int{}, goodAt: map[[2]int64]int{}, produced: map[int32]int64{}}
	a.dlq = a.topic + ".dlq"
	kc.CreateTopic(t, a.topic, int32(a.partitions))
	kc.CreateTopic(t, a.dlq, 1)
	_, err := a.db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE TABLE %[1]s.adv_effects (
  applied_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  message_id text NOT NULL,
  k          bytea
);
CREATE FUNCTION %[1]s.adv_apply(doc jsonb) RETURNS void LANGUAGE sql AS $$
  INSERT INTO %[1]s.adv_effects (message_id, k) VALUES (doc->>'message_id', convert_to(doc->>'key', 'UTF8'))
$$;`, a.db.Schema))
	require.NoError(t, err)
	for i := range cases {
		cases[i] = cases[i].tagged(i)
	}
	a.cases = cases
	return a
}

// produce writes each case's bad record and the good record behind it to the case's partition.
func (a *adversarialConsumer) produce(goodRecord func(i int, key []byte) *kgo.Record) {
	t := a.t
	cl := a.kc.NewClient(t, kgo.ProducerBatchMaxBytes(2<<20), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i, c := range a.cases {
		part := int32(i % a.partitions)
		bad := &kgo.Record{Topic: a.topic, Partition: part, Key: c.Key, Value: c.Value, Headers: c.Headers}
		r, err := cl.ProduceSync(ctx, bad).First()
		require.NoError(t, err, "produce case %d (%s)", i, c)
		a.badAt[[2]int64{int64(part), r.Offset}] = i
		g := goodRecord(i, goodKey(c, i))
		g.Topic, g.Partition = a.topic, part
		r, err = cl.ProduceSync(ctx, g).First()
		require.NoError(t, err, "produce the good record of case %d", i)
		a.goodAt[[2]int64{int64(part), r.Offset}] = i
		a.produced[part] = r.Offset + 1
	}
}

// keiroGood is the good JSON keiro record of case i.
func keiroGood(i int, key []byte) *kgo.Record {
	return &kgo.Record{Key: key, Value: []byte(fmt.Sprintf(`{"seq":%d}`, i)), Headers: validHeaders(good(i))}
}

// check waits until the group committed every record, then checks: every bad record is either
// handled once or dead-lettered once with a reason (MustDeadLetter ones dead-lettered), every
// good record is handled exactly once, after its bad record, and nothing else arrived.
func (a *adversarialConsumer) check(handled func() []delivered, logs func() string) {
	t := a.t
	ctx := context.Background()
	adm := kadm.NewClient(a.kc.Client)
	waitState(t, 90*time.Second, "the consumer committed every record and handled every good one", func() (bool, string) {
		seen := map[int]bool{}
		for _, d := range handled() {
			if d.good >= 0 {
				seen[d.good] = true
			}
		}
		committed := map[int32]int64{}
		if offs, err := adm.FetchOffsets(ctx, a.group); err == nil {
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Topic == a.topic {
					committed[o.Partition] = o.At
				}
			})
		}
		var open []string
		for i, c := range a.cases {
			part := int32(i % a.partitions)
			if at, end := committed[part], a.produced[part]; !seen[i] || at != end {
				open = append(open, fmt.Sprintf("case %d (partition %d committed to offset %d of %d, good record handled: %v): %s",
					i, part, at, end, seen[i], c))
			}
		}
		return len(open) == 0, fmt.Sprintf("%d of %d cases open:\n%s\nlog:\n%s", len(open), len(a.cases), strings.Join(open, "\n"), logs())
	})

	dlq, err := a.kc.ReadTopic(ctx, a.dlq)
	require.NoError(t, err)
	deadLettered, reasons := map[int]int{}, map[string]int{}
	for _, r := range dlq {
		h := map[string]string{}
		for _, x := range r.Headers {
			if _, ok := h[x.Key]; !ok || strings.HasPrefix(x.Key, "keiro-dlq-") {
				h[x.Key] = string(x.Value)
			}
		}
		part, err1 := strconv.ParseInt(h[inbox.HeaderDLQPartition], 10, 32)
		off, err2 := strconv.ParseInt(h[inbox.HeaderDLQOffset], 10, 64)
		require.True(t, err1 == nil && err2 == nil, "dead letter without a readable partition and offset: %v", h)
		if g, ok := a.goodAt[[2]int64{part, off}]; ok {
			t.Fatalf("the good record of case %d was dead-lettered: %s: %s", g, h[inbox.HeaderDLQReason], h[inbox.HeaderDLQError])
		}
		i, ok := a.badAt[[2]int64{part, off}]
		require.True(t, ok, "dead letter of partition %d offset %d, which no case produced", part, off)
		require.NotEmpty(t, h[inbox.HeaderDLQReason], "case %d (%s): dead letter without a reason", i, a.cases[i])
		require.NotEmpty(t, h[inbox.HeaderDLQError], "case %d (%s): dead letter without an error", i, a.cases[i])
		// A dead letter keeps the value; one too large for Kafka with its dead-letter headers
		// (the dead-letter test's case) omits it.
		if !bytes.Equal(a.cases[i].Value, r.Value) {
			require.True(t, len(r.Value) == 0 && len(a.cases[i].Value) > 900_000,
				"case %d: the dead letter changed the value: %s", i, shown(r.Value))
		}
		require.Equal(t, a.cases[i].Key, r.Key, "case %d: the dead letter keeps the key", i)
		if n, err := strconv.Atoi(h[inbox.HeaderDLQAttempts]); err == nil {
			require.LessOrEqual(t, n, consumerMaxAttempts, "case %d (%s) used more than its attempts", i, a.cases[i])
		}
		deadLettered[i]++
		reasons[h[inbox.HeaderDLQReason]]++
	}
	handledBad, handledGood := map[int]int{}, map[int]int{}
	for _, d := range handled() {
		switch {
		case d.bad >= 0:
			handledBad[d.bad]++
			require.Zero(t, handledGood[d.bad], "case %d: its good record was handled before it", d.bad)
		case d.good >= 0:
			handledGood[d.good]++
		default:
			t.Fatalf("the handler received an event no case produced: %s", d.what)
		}
	}
	for i, c := range a.cases {
		require.Equal(t, 1, handledGood[i], "the good record behind case %d (%s) is handled exactly once", i, c)
		n := handledBad[i] + deadLettered[i]
		require.Equal(t, 1, n, "case %d (%s): handled %d times and dead-lettered %d times; want one of them once",
			i, c, handledBad[i], deadLettered[i])
		if c.MustDeadLetter {
			require.Equal(t, 1, deadLettered[i], "case %d (%s) can never be handled: it must be dead-lettered", i, c)
		}
	}
	t.Logf("%d bad records: %d handled, %d dead-lettered (reasons %v); %d good records handled once, each after its bad one",
		len(a.cases), len(handledBad), len(deadLettered), reasons, len(handledGood))
}

// effectsHandled reads adv_effects in applied order.
func (a *adversarialConsumer) effectsHandled() []delivered {
	rows, err := a.db.Pool.Query(context.Background(), `SELECT message_id FROM `+a.db.Schema+`.adv_effects ORDER BY applied_id`)
	if err != nil {
		return nil
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil
	}
	out := make([]delivered, len(ids))
	for i, id := range ids {
		out[i] = classify(id)
	}
	return out
}

// consumerCases are the fixed cases and the generated ones.
func consumerCases(t *testing.T) []consumerCase {
	return append(fixedConsumerCases(), generate(consumerCaseGen, adversarialSeed(t), adversarialN(t, 6))...)
}

// consumerMaxAttempts is the consumer's retry budget in the suite.
const consumerMaxAttempts = 2

// startConsumer starts the consumer binary on the setup's topic with a small retry budget.
func (a *adversarialConsumer) startConsumer(extra ...string) *proc {
	env := consumerEnv(a.db, a.kc, a.group, a.topic, append([]string{
		"KEIRO_CONSUMER_SQL_FUNCTION=" + a.db.Schema + ".adv_apply", fmt.Sprintf("KEIRO_CONSUMER_MAX_ATTEMPTS=%d", consumerMaxAttempts),
		"KEIRO_CONSUMER_BACKOFF_INITIAL=20ms", "KEIRO_CONSUMER_BACKOFF_MAX=200ms",
		fmt.Sprintf("KEIRO_CONSUMER_CONCURRENCY=%d", a.partitions)}, extra...)...)
	p := startProc(a.t, "consumer", consumerBin, consumerAddrRe, env)
	p.waitAddr(a.t, 30*time.Second)
	return p
}

// TestAdversarialConsumerGo: the go handler (the inbox library's Consumer, in process), writing
// its effects in the inbox transaction.
func TestAdversarialConsumerGo(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, kc *testenv.Kafka) {
		a := newAdversarialConsumer(t, kc, consumerCases(t))
		a.produce(keiroGood)
		var logs strings.Builder
		var mu sync.Mutex
		c, err := inbox.NewConsumer(a.db.Pool, inbox.ConsumerConfig{
			Brokers: kc.Seeds, Group: a.group, Topics: []string{a.topic}, MaxConcurrentPartitions: a.partitions,
			Store:  inbox.StoreConfig{Schema: a.db.Schema, MaxAttempts: consumerMaxAttempts},
			Retry:  keiro.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
			Logger: newTestLogger(&mu, &logs),
		}, func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
			var key []byte
			if ev.Key != nil {
				key = []byte(*ev.Key)
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+a.db.Schema+`.adv_effects (message_id, k) VALUES ($1, $2)`,
				strings.ToValidUTF8(strings.ReplaceAll(ev.MessageID, "\x00", ""), "?"), key)
			return err
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		a.check(a.effectsHandled, func() string { mu.Lock(); defer mu.Unlock(); return tail(logs.String(), 60) })
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("the consumer did not stop within 30s of its context's end")
		}
	})
}

// TestAdversarialConsumerSQL: the consumer binary in sql mode.
func TestAdversarialConsumerSQL(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, kc *testenv.Kafka) {
		a := newAdversarialConsumer(t, kc, consumerCases(t))
		a.produce(keiroGood)
		p := a.startConsumer()
		a.check(a.effectsHandled, func() string { return logTail(p) })
		require.Equal(t, 0, p.term(t, 30*time.Second), logTail(p))
	})
}

// TestAdversarialConsumerHTTP: the consumer binary in http mode, in each format, against a
// service that accepts every request.
func TestAdversarialConsumerHTTP(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"keiro", "cloudevents-structured", "cloudevents-binary"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, kc *testenv.Kafka) {
				a := newAdversarialConsumer(t, kc, consumerCases(t))
				a.produce(keiroGood)
				var mu sync.Mutex
				var got []delivered
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					// The event's id: in the Idempotency-Key, the ce-id header (percent-encoded
					// where it must be) or the body.
					id := r.Header.Get("Idempotency-Key") + " " + r.Header.Get("Ce-Id")
					if u, err := url.PathUnescape(r.Header.Get("Ce-Id")); err == nil {
						id += " " + u
					}
					d := classify(id + " " + string(body))
					mu.Lock()
					got = append(got, d)
					mu.Unlock()
					w.WriteHeader(http.StatusOK)
				}))
				t.Cleanup(srv.Close)
				p := a.startConsumer("KEIRO_CONSUMER_HANDLER=http", "KEIRO_CONSUMER_HTTP_URL="+srv.URL+"/events",
					"KEIRO_CONSUMER_HTTP_FORMAT="+format)
				a.check(func() []delivered {
					mu.Lock()
					defer mu.Unlock()
					return append([]delivered(nil), got...)
				}, func() string { return logTail(p) })
				require.Equal(t, 0, p.term(t, 30*time.Second), logTail(p))
			})
		})
	}
}

// avroCaseGen generates Avro payloads the registry cannot resolve or decode: an unknown schema
// id, a short or unframed payload, a known id with junk after it.
func avroCaseGen(knownID int) *rapid.Generator[consumerCase] {
	return rapid.Custom(func(t *rapid.T) consumerCase {
		c := consumerCase{Name: "generated avro", Key: []byte(rapid.StringMatching(`[a-z]{1,8}`).Draw(t, "key")), Headers: validHeaders("")}
		c.Headers = setHeader(c.Headers, envelope.HeaderContentType, []byte(schema.ContentTypeAvro))
		body := junkBytes(24).Draw(t, "body")
		switch rapid.IntRange(0, 3).Draw(t, "kind") {
		case 0:
			id := rapid.Uint32Range(uint32(knownID)+1000, 1<<31).Draw(t, "unknown id")
			c.Value = binary.BigEndian.AppendUint32([]byte{0}, id)
			c.Value, c.MustDeadLetter = append(c.Value, body...), true
		case 1:
			c.Value, c.MustDeadLetter = junkBytes(4).Draw(t, "short"), true
		case 2:
			c.Value = append([]byte{1, 0, 0, 0, byte(knownID)}, body...)
			c.MustDeadLetter = true
		default:
			c.Value = append(binary.BigEndian.AppendUint32([]byte{0}, uint32(knownID)), body...)
		}
		return c
	})
}

// TestAdversarialConsumerAvro: the consumer binary in sql mode with the real schema registry
// (Apicurio): Avro payloads with a schema id the registry does not know, and undecodable ones.
func TestAdversarialConsumerAvro(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, kc *testenv.Kafka) {
		ctx := context.Background()
		reg := testenv.NewSchemaRegistry(t)
		r, err := schema.NewRegistry(schema.RegistryConfig{URL: reg.URL})
		require.NoError(t, err)
		ser, err := schema.NewSerializer(r, counterAvro, schema.SerializerConfig{AutoRegister: true})
		require.NoError(t, err)
		subjectTopic := reg.Name("adv") // the records' subject is the test's own on the shared registry
		probe := keyedEvent(subjectTopic, "k", 0)
		require.NoError(t, ser.Encode(ctx, &probe, map[string]any{"seq": int64(0)}))
		knownID := int(binary.BigEndian.Uint32(probe.Payload[1:5]))

		avro := func(name string, v []byte) consumerCase {
			hs := setHeader(validHeaders(""), envelope.HeaderContentType, []byte(schema.ContentTypeAvro))
			return consumerCase{Name: name, Key: []byte("k-avro"), Value: v, Headers: hs, MustDeadLetter: true}
		}
		cases := []consumerCase{
			avro("unknown schema id", []byte{0, 0x7f, 0x7f, 0x7f, 0x7f, 2}),
			avro("schema id 0", []byte{0, 0, 0, 0, 0, 2}),
			avro("empty payload", []byte{}),
			avro("magic byte only", []byte{0}),
			avro("wrong magic byte", []byte{9, 0, 0, 0, byte(knownID), 2}),
		}
		cases = append(cases, generate(avroCaseGen(knownID), adversarialSeed(t), adversarialN(t, 6))...)
		a := newAdversarialConsumer(t, kc, cases)
		a.produce(func(i int, key []byte) *kgo.Record {
			ev := keyedEvent(subjectTopic, "k", int64(i))
			require.NoError(t, ser.Encode(ctx, &ev, map[string]any{"seq": int64(i)}))
			hs := setHeader(validHeaders(good(i)), envelope.HeaderContentType, []byte(ev.ContentType))
			return &kgo.Record{Key: key, Value: ev.Payload, Headers: hs}
		})
		p := a.startConsumer("KEIRO_CONSUMER_SCHEMA_REGISTRY_URL=" + reg.URL)
		a.check(a.effectsHandled, func() string { return logTail(p) })
		require.Equal(t, 0, p.term(t, 30*time.Second), logTail(p))
	})
}
