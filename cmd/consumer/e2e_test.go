package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/apifuzz"
)

// proc is a consumer binary running in the background.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	done chan struct{}
	code int

	mu     sync.Mutex
	stderr strings.Builder
	lines  chan string // stderr lines, for waitLog
}

// startBinary starts the consumer with env and args; it is killed if still running when t ends.
func startBinary(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(baseEnv(), env...)
	errPipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = io.Discard
	require.NoError(t, cmd.Start())
	p := &proc{t: t, cmd: cmd, done: make(chan struct{}), lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(errPipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		close(p.lines)
		err := cmd.Wait()
		p.code = 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -1
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// waitLog waits for a stderr line matching re and returns its submatches.
func (p *proc) waitLog(re *regexp.Regexp, timeout time.Duration) []string {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("consumer exited before logging %s:\n%s", re, p.log())
			}
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-deadline:
			p.t.Fatalf("consumer did not log %s within %s:\n%s", re, timeout, p.log())
		}
	}
}

// stop sends SIGTERM and returns the exit code.
func (p *proc) stop(timeout time.Duration) int {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("consumer did not exit within %s of SIGTERM:\n%s", timeout, p.log())
		return -1
	}
}

// produce writes events as keiro records (key, payload, keiro headers) to topic.
func produce(t *testing.T, cl *kgo.Client, topic string, evs ...envelope.Event) {
	t.Helper()
	recs := make([]*kgo.Record, 0, len(evs))
	for i := range evs {
		ev := &evs[i]
		r := &kgo.Record{Topic: topic, Value: ev.Payload}
		if ev.Key != nil {
			r.Key = []byte(*ev.Key)
		}
		for _, h := range ev.Headers() {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		recs = append(recs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
}

// waitFor polls cond until it holds; the condition is the signal (the binary is another
// process), the interval only bounds the polling rate.
// committedAll reports whether group committed every record of topic.
func committedAll(t *testing.T, adm *kadm.Client, group, topic string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return false
	}
	ok := true
	ends.Each(func(o kadm.ListedOffset) {
		c, found := offs.Lookup(o.Topic, o.Partition)
		if o.Offset > 0 && (!found || c.At != o.Offset) {
			ok = false
		}
	})
	return ok
}

func e2eEnv(db *testenv.DB, kc *testenv.Kafka, group, topic string, extra ...string) []string {
	return append([]string{
		"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(),
		"KEIRO_CONSUMER_SCHEMA=" + db.Schema,
		"KEIRO_CONSUMER_BROKERS=" + strings.Join(kc.Seeds, ","),
		"KEIRO_CONSUMER_GROUP=" + group,
		"KEIRO_CONSUMER_TOPICS=" + topic,
		"KEIRO_CONSUMER_HTTP_ADDR=127.0.0.1:0",
		"KEIRO_CONSUMER_LOG_LEVEL=debug",
	}, extra...)
}

var servingRe = regexp.MustCompile(`msg="serving /healthz, /readyz and /metrics" addr=(\S+)`)

func TestRunSQLModeEffectsExactlyOnce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	sqlFixture(t, db)
	kc := testenv.NewKafka(t)
	const topic = "orders.v1"
	kc.CreateTopic(t, topic, 3)
	cl := kc.NewClient(t)

	var evs []envelope.Event
	want := map[string]int{}
	for i := range 30 {
		ev := orderEvent(fmt.Sprintf("o-%02d", i), i)
		evs = append(evs, ev)
		want[ev.MessageID] = i
	}
	// Duplicates: the producer republished a third of the messages (same message id).
	evs = append(evs, evs[:10]...)
	produce(t, cl, topic, evs...)

	p := startBinary(t, e2eEnv(db, kc, "billing", topic,
		"KEIRO_CONSUMER_HANDLER=sql", "KEIRO_CONSUMER_SQL_FUNCTION="+db.Schema+".apply_event"))
	addr := p.waitLog(servingRe, 30*time.Second)[1]

	adm := kadm.NewClient(cl)
	testenv.WaitFor(t, 30*time.Second, "every record committed", func() bool { return committedAll(t, adm, "billing", topic) })
	require.Equal(t, want, effects(t, db))

	// Health endpoints answer on the logged address; /metrics has the inbox counters.
	bodies := map[string]string{}
	for path, code := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200} {
		resp, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, code, resp.StatusCode, path)
		bodies[path] = string(b)
	}
	require.Regexp(t, `keiro_inbox_processed\S*\{[^}]*keiro_consumer_name="billing"[^}]*\} 30`, bodies["/metrics"])
	require.Regexp(t, `keiro_inbox_duplicates\S*\{[^}]*\} 10`, bodies["/metrics"])
	require.Regexp(t, `messaging_client_consumed_messages_total\{[^}]*messaging_consumer_group_name="billing"[^}]*\} 40`, bodies["/metrics"])
	require.Contains(t, bodies["/metrics"], "messaging_kafka_fetch_records_count", "franz-go's client metrics")
	require.NotContains(t, bodies["/metrics"], "otel_scope_")

	// The admin API and console answer on loopback without a token: lag read from Kafka.
	resp, err := http.Get("http://" + addr + "/api/v1/consumer/lag")
	require.NoError(t, err)
	lag, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, string(lag))
	require.Contains(t, string(lag), `"group": "billing"`)
	require.Contains(t, string(lag), `"total_lag": 0`)
	resp, err = http.Get("http://" + addr + "/console/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)

	// consumer status --admin-url asks the running consumer for the partitions it owns: each
	// with its last commit and nothing stuck, in JSON and as text.
	statusEnv := []string{"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(), "KEIRO_CONSUMER_SCHEMA=" + db.Schema}
	sr := runBinary(t, 60*time.Second, statusEnv, "status", "--json", "--admin-url=http://"+addr)
	require.Equal(t, 0, sr.code, sr.stderr)
	var st inboxStatus
	require.NoError(t, json.Unmarshal([]byte(sr.stdout), &st), sr.stdout)
	require.NotNil(t, st.Partitions, sr.stdout)
	require.Equal(t, "billing", st.Partitions.Group)
	require.Zero(t, st.Partitions.Stuck)
	require.Len(t, st.Partitions.Partitions, 3, sr.stdout)
	for _, pl := range st.Partitions.Partitions {
		require.NotNil(t, pl.Progress, "partition %d is owned by the running consumer", pl.Partition)
		require.Nil(t, pl.Progress.StuckSince)
		require.Zero(t, pl.Lag)
	}
	sr = runBinary(t, 60*time.Second, statusEnv, "status", "--admin-url=http://"+addr+"/")
	require.Equal(t, 0, sr.code, sr.stderr)
	require.Contains(t, sr.stdout, "running consumer, group billing: 3 partition(s), 0 stuck")
	require.Regexp(t, `(?m)^orders\.v1\s+0\s+0\s+-\s+-\s+\S+\s+idle$`, sr.stdout)

	// More duplicates while running, and one new message.
	produce(t, cl, topic, evs[5], evs[20], orderEvent("o-new", 99))
	want["o-new"] = 99
	testenv.WaitFor(t, 30*time.Second, "new records committed", func() bool { return committedAll(t, adm, "billing", topic) })
	require.Equal(t, want, effects(t, db))

	require.Equal(t, 0, p.stop(30*time.Second), p.log())
	require.Contains(t, p.log(), `msg=stopped`)

	// A restarted consumer, now in batches of 16 (one round trip for the function calls of a
	// batch), finds nothing to redo; new messages and more duplicates apply exactly once.
	p = startBinary(t, e2eEnv(db, kc, "billing", topic, "KEIRO_CONSUMER_BATCH_SIZE=16",
		"KEIRO_CONSUMER_HANDLER=sql", "KEIRO_CONSUMER_SQL_FUNCTION="+db.Schema+".apply_event"))
	p.waitLog(servingRe, 30*time.Second)
	more := []envelope.Event{evs[0]}
	for i := range 40 {
		ev := orderEvent(fmt.Sprintf("b-%02d", i), 100+i)
		want[ev.MessageID] = 100 + i
		more = append(more, ev)
		if i%4 == 0 {
			more = append(more, ev)
		}
	}
	produce(t, cl, topic, more...)
	testenv.WaitFor(t, 30*time.Second, "redelivery committed", func() bool { return committedAll(t, adm, "billing", topic) })
	require.Equal(t, 0, p.stop(30*time.Second), p.log())
	require.Equal(t, want, effects(t, db))
}

func TestRunHTTPModeWithDeadLetters(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	const topic = "payments.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	cl := kc.NewClient(t)

	type req struct {
		key, traceparent string
		doc              map[string]any
	}
	var (
		mu   sync.Mutex
		reqs []req
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var doc map[string]any
		if err := json.NewDecoder(r.Body).Decode(&doc); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		reqs = append(reqs, req{key: r.Header.Get("Idempotency-Key"), doc: doc, traceparent: r.Header.Get("traceparent")})
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer t0ken" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if doc["message_id"] == "p-down" {
			// The message's own failure (a 503 would be an outage of the target: no attempt).
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		if doc["message_id"] == "p-rejected" {
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"error":"unknown account"}`)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)

	good := orderEvent("p-1", 10)
	good.TraceContext = &envelope.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	rejected := orderEvent("p-rejected", 20)
	produce(t, cl, topic, good, rejected, good, orderEvent("p-down", 30))
	// A record without keiro headers cannot be decoded: it is dead-lettered as is.
	ctx := context.Background()
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("junk"), Value: []byte("not an event")}).FirstErr())

	p := startBinary(t, e2eEnv(db, kc, "ledger", topic,
		"KEIRO_CONSUMER_HANDLER=http", "KEIRO_CONSUMER_HTTP_URL="+srv.URL+"/events",
		"KEIRO_CONSUMER_HTTP_HEADER=Authorization: Bearer t0ken", "KEIRO_CONSUMER_NAME=ledger-inbox",
		"KEIRO_CONSUMER_MAX_ATTEMPTS=2"))
	addr := p.waitLog(servingRe, 30*time.Second)[1]

	dlq := kc.ConsumeRecords(t, 3, 30*time.Second, topic+".dlq")
	require.Len(t, dlq, 3, p.log())
	reasons := map[string]*kgo.Record{}
	for _, r := range dlq {
		for _, h := range r.Headers {
			if h.Key == inbox.HeaderDLQReason {
				reasons[string(h.Value)] = r
			}
		}
	}
	require.Contains(t, reasons, inbox.ReasonDecode)
	require.Equal(t, "not an event", string(reasons[inbox.ReasonDecode].Value))
	require.Contains(t, reasons, inbox.ReasonPoisoned, "p-down failed --max-attempts times")
	require.Equal(t, `{"amount":30}`, string(reasons[inbox.ReasonPoisoned].Value))
	require.Contains(t, reasons, inbox.ReasonPermanent)
	perm := reasons[inbox.ReasonPermanent]
	require.Equal(t, `{"amount":20}`, string(perm.Value), "the original bytes are dead-lettered")
	var dlqErr string
	for _, h := range perm.Headers {
		if h.Key == inbox.HeaderDLQError {
			dlqErr = string(h.Value)
		}
	}
	require.Contains(t, dlqErr, "422")
	require.Contains(t, dlqErr, "unknown account")

	// The console lists the dead-letter topic of --dlq-topic with the reasons; only the record
	// that never reached the inbox (decode) is offered for replay.
	resp, err := http.Get("http://" + addr + "/api/v1/inbox/dead-letters")
	require.NoError(t, err)
	var dl console.DeadLetterPage
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&dl))
	resp.Body.Close()
	require.Equal(t, []console.DeadLetterTopic{{Topic: topic + ".dlq", Records: 3}}, dl.Topics)
	require.Len(t, dl.Records, 3)
	replayable := map[string]bool{}
	for _, d := range dl.Records {
		replayable[d.Reason] = d.Replayable
	}
	require.Equal(t, map[string]bool{inbox.ReasonDecode: true, inbox.ReasonPoisoned: false, inbox.ReasonPermanent: false}, replayable)

	adm := kadm.NewClient(cl)
	testenv.WaitFor(t, 30*time.Second, "every record committed", func() bool { return committedAll(t, adm, "ledger", topic) })
	require.Equal(t, 0, p.stop(30*time.Second), p.log())

	mu.Lock()
	defer mu.Unlock()
	var keys []string
	for _, r := range reqs {
		keys = append(keys, r.key)
	}
	// p-1 was delivered twice to Kafka but reached the service once; p-rejected once; p-down
	// was tried --max-attempts times, always with the same key.
	require.ElementsMatch(t, []string{"ledger-inbox:ordering:p-1", "ledger-inbox:ordering:p-rejected",
		"ledger-inbox:ordering:p-down", "ledger-inbox:ordering:p-down"}, keys)
	for _, r := range reqs {
		if r.doc["message_id"] == "p-1" {
			require.Equal(t, map[string]any{"amount": float64(10)}, r.doc["payload"])
			require.Equal(t, "k-p-1", r.doc["key"])
			require.Contains(t, r.traceparent, "-4bf92f3577b34da6a3ce929d0e0e4736-", "the service joins the producer's trace")
		}
	}

	// The rejected message is a failed row an operator can see.
	r := runBinary(t, 30*time.Second, []string{"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(), "KEIRO_CONSUMER_SCHEMA=" + db.Schema},
		"inbox", "failed", "list", "--name=ledger-inbox")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "ordering:p-rejected")
	require.Contains(t, r.stdout, "ordering:p-down")
	require.Contains(t, r.stdout, "payments.v1/0@1")
}

func TestRunRefusesUnmigratedSchema(t *testing.T) {
	t.Parallel()
	schema := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	conn, err := pgx.Connect(context.Background(), testenv.DatabaseURL())
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), `CREATE FUNCTION `+schema+`.f(doc jsonb) RETURNS void LANGUAGE sql AS 'SELECT 1'`)
	require.NoError(t, err)
	require.NoError(t, conn.Close(context.Background()))
	kc := testenv.NewKafka(t)
	env := []string{
		"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(), "KEIRO_CONSUMER_SCHEMA=" + schema,
		"KEIRO_CONSUMER_BROKERS=" + strings.Join(kc.Seeds, ","), "KEIRO_CONSUMER_GROUP=g",
		"KEIRO_CONSUMER_TOPICS=t", "KEIRO_CONSUMER_HANDLER=sql", "KEIRO_CONSUMER_SQL_FUNCTION=" + schema + ".f",
		"KEIRO_CONSUMER_HTTP_ADDR=",
	}
	r := runBinary(t, 30*time.Second, env)
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "run `consumer migrate` or pass --migrate")

	// --migrate applies them, then consumes until SIGTERM.
	p := startBinary(t, append(env, "KEIRO_CONSUMER_MIGRATE=true", "KEIRO_CONSUMER_LOG_LEVEL=debug"))
	p.waitLog(regexp.MustCompile(`msg=consuming`), 30*time.Second)
	require.Equal(t, 0, p.stop(30*time.Second), p.log())
}

func TestRunSIGTERMFinishesInFlightMessage(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	const topic = "slow.v1"
	kc.CreateTopic(t, topic, 1)
	cl := kc.NewClient(t)

	arrived, release := make(chan string, 4), make(chan struct{})
	var calls sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var doc map[string]any
		_ = json.NewDecoder(r.Body).Decode(&doc)
		id, _ := doc["message_id"].(string)
		n, _ := calls.LoadOrStore(id, new(int))
		*n.(*int)++
		arrived <- id
		<-release
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	produce(t, cl, topic, orderEvent("s-1", 1))
	env := e2eEnv(db, kc, "slow", topic, "KEIRO_CONSUMER_HANDLER=http", "KEIRO_CONSUMER_HTTP_URL="+srv.URL,
		"KEIRO_CONSUMER_HTTP_TIMEOUT=60s")
	p := startBinary(t, env)
	addr := p.waitLog(servingRe, 30*time.Second)[1]
	select {
	case id := <-arrived:
		require.Equal(t, "s-1", id)
	case <-time.After(30 * time.Second):
		t.Fatalf("no delivery:\n%s", p.log())
	}
	// SIGTERM while the service is still answering: the consumer waits for the answer,
	// commits the inbox row and the offset, and exits 0.
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	testenv.WaitFor(t, 10*time.Second, "/readyz turns 503 once SIGTERM is received", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	close(release)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("consumer did not exit after SIGTERM:\n%s", p.log())
	}
	require.Equal(t, 0, p.code, p.log())
	adm := kadm.NewClient(cl)
	require.True(t, committedAll(t, adm, "slow", topic), "the in-flight message's offset was committed:\n%s", p.log())

	// Restarted, the consumer does not deliver s-1 again.
	produce(t, cl, topic, orderEvent("s-2", 2))
	p = startBinary(t, env)
	select {
	case id := <-arrived:
		require.Equal(t, "s-2", id)
	case <-time.After(30 * time.Second):
		t.Fatalf("no delivery:\n%s", p.log())
	}
	require.Equal(t, 0, p.stop(30*time.Second), p.log())
	n, _ := calls.Load("s-1")
	require.Equal(t, 1, *n.(*int))
}

func TestRunReadinessFollowsKafkaOutage(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	sqlFixture(t, db)
	kc := testenv.NewKafka(t)
	const topic = "outage.v1"
	kc.CreateTopic(t, topic, 1)
	produce(t, kc.NewClient(t), topic, orderEvent("x-1", 1))

	p := startBinary(t, e2eEnv(db, kc, "outage", topic, "KEIRO_CONSUMER_HANDLER=sql",
		"KEIRO_CONSUMER_SQL_FUNCTION="+db.Schema+".apply_event", "KEIRO_CONSUMER_SHUTDOWN_TIMEOUT=5s"))
	addr := p.waitLog(servingRe, 30*time.Second)[1]
	testenv.WaitFor(t, 30*time.Second, "x-1 applied", func() bool { return len(effects(t, db)) == 1 })

	readyz := func() (int, inboxReadiness) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, inboxReadiness{}
		}
		defer resp.Body.Close()
		var body inboxReadiness
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	code, body := readyz()
	require.Equal(t, http.StatusOK, code, "%+v", body)

	kc.Cluster.Close()
	testenv.WaitFor(t, 30*time.Second, "/readyz reports Kafka down", func() bool {
		code, body := readyz()
		return code == http.StatusServiceUnavailable && len(body.Failing) == 1 && body.Failing[0] == "kafka"
	})
	// Shutdown with the brokers gone still ends within the shutdown timeout, with status 0.
	require.Equal(t, 0, p.stop(60*time.Second), p.log())
}

// inboxReadiness is the part of the /readyz body the tests read.
type inboxReadiness struct {
	Status  string   `json:"status"`
	Failing []string `json:"failing"`
}

// TestAdminAPIFuzzed runs schemathesis against the running consumer's admin API, with a
// poisoned message in its inbox and its dead-letter topic (keirotest/testenv/apifuzz: no 5xx, only the
// statuses and JSON its OpenAPI document declares).
func TestAdminAPIFuzzed(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	sqlFixture(t, db)
	kc := testenv.NewKafka(t)
	const topic = "orders.v1"
	kc.CreateTopic(t, topic, 1)
	kc.CreateTopic(t, topic+".dlq", 1)
	bad := orderEvent("bad-1", 0)
	bad.Payload = []byte(`{"mode":"poison"}`)
	produce(t, kc.NewClient(t), topic, orderEvent("ok-1", 1), bad)
	p := startBinary(t, e2eEnv(db, kc, "billing", topic,
		"KEIRO_CONSUMER_HANDLER=sql", "KEIRO_CONSUMER_SQL_FUNCTION="+db.Schema+".apply_event",
		"KEIRO_CONSUMER_ADMIN_TOKEN=fuzz-token"))
	addr := p.waitLog(servingRe, 30*time.Second)[1]
	kc.ConsumeRecords(t, 1, 30*time.Second, topic+".dlq")
	apifuzz.Run(t, "http://"+addr, "fuzz-token", p.log)
}
