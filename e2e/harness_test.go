package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// The log lines in which the binaries announce their HTTP address (text log format).
var (
	relayAddrRe    = regexp.MustCompile(`msg="http server listening" addr=(\S+)`)
	consumerAddrRe = regexp.MustCompile(`msg="serving /healthz, /readyz and /metrics" addr=(\S+)`)
)

// proc is a relay or consumer binary running as a child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is read
	addr chan string   // receives the HTTP address once logged

	mu   sync.Mutex
	out  strings.Builder
	code int
}

// startProc starts bin with env (added to a clean environment); the process is killed when t
// ends if it is still running.
func startProc(t *testing.T, name, bin string, addrRe *regexp.Regexp, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(baseEnv(), env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	require.NoError(t, cmd.Start(), "start %s", name)
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), addr: make(chan string, 1)}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.out.WriteString(line + "\n")
			p.mu.Unlock()
			if !found {
				if m := addrRe.FindStringSubmatch(line); m != nil {
					found = true
					p.addr <- m[1]
				}
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		err := cmd.Wait()
		_ = pw.Close()
		<-scanned
		p.mu.Lock()
		p.code = 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -1
		}
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s's output, its last 40 lines:\n%s", p.name, tail(p.log(), 40))
		}
	})
	return p
}

func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KEIRO_RELAY_") || strings.HasPrefix(kv, "KEIRO_CONSUMER_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// waitAddr waits for the process to log its HTTP address.
func (p *proc) waitAddr(t *testing.T, timeout time.Duration) string {
	t.Helper()
	select {
	case a := <-p.addr:
		p.addr <- a
		return a
	case <-p.done:
		t.Fatalf("%s exited before serving HTTP:\n%s", p.name, p.log())
	case <-time.After(timeout):
		t.Fatalf("%s did not serve HTTP within %s:\n%s", p.name, timeout, p.log())
	}
	return ""
}

// kill sends SIGKILL (if still running) and waits for the exit.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// term sends SIGTERM and returns the exit code; t fails if the process outlives timeout.
func (p *proc) term(t *testing.T, timeout time.Duration) int {
	t.Helper()
	code, err := p.stop(timeout)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// stop sends SIGTERM and waits up to timeout for the exit. If the process hangs, it gets a
// SIGQUIT (Go prints every goroutine's stack) and the error carries the end of its output.
// Unlike term it may run on any goroutine.
func (p *proc) stop(timeout time.Duration) (int, error) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
		}
		return -1, fmt.Errorf("%s did not exit within %s of SIGTERM:\n%s", p.name, timeout, tail(p.log(), 400))
	}
	return p.exitCode(), nil
}

// exitCode is the exit code once the process has exited (-1 for a signal).
func (p *proc) exitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// metric sums the samples of a Prometheus metric family served at addr (0 if absent).
func metric(addr, name string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("parse %q: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

func relayEnv(db *testenv.DB, kc *testenv.Kafka, extra ...string) []string {
	return append([]string{
		"KEIRO_RELAY_DATABASE_URL=" + testenv.DatabaseURL(),
		"KEIRO_RELAY_SCHEMA=" + db.Schema,
		"KEIRO_RELAY_BROKERS=" + strings.Join(kc.Seeds, ","),
		"KEIRO_RELAY_HTTP_ADDR=127.0.0.1:0",
		"KEIRO_RELAY_POLL_INTERVAL=200ms",
		"KEIRO_RELAY_BACKOFF_INITIAL=100ms",
		"KEIRO_RELAY_BACKOFF_MAX=1s",
		"KEIRO_RELAY_MAINTENANCE_INTERVAL=1s",
		"KEIRO_RELAY_SHUTDOWN_TIMEOUT=5s",
	}, extra...)
}

// consumerEnv is the consumer's environment for group and topic (names from kc.Group and
// kc.Topic).
func consumerEnv(db *testenv.DB, kc *testenv.Kafka, group, topic string, extra ...string) []string {
	return append([]string{
		"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(),
		"KEIRO_CONSUMER_SCHEMA=" + db.Schema,
		"KEIRO_CONSUMER_BROKERS=" + strings.Join(kc.Seeds, ","),
		"KEIRO_CONSUMER_GROUP=" + group,
		"KEIRO_CONSUMER_TOPICS=" + topic,
		"KEIRO_CONSUMER_HANDLER=sql",
		"KEIRO_CONSUMER_SQL_FUNCTION=" + db.Schema + ".apply_event",
		"KEIRO_CONSUMER_HTTP_ADDR=127.0.0.1:0",
		"KEIRO_CONSUMER_SHUTDOWN_TIMEOUT=5s",
	}, extra...)
}

// effectsFixture creates the consumer's effects: apply_event(doc) records (key, seq,
// message id) in applied order. effects has no unique key, so a twice-applied message shows.
// A negative seq is a poison message (SQLSTATE KP001: dead-lettered at once).
func effectsFixture(t *testing.T, db *testenv.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE TABLE %[1]s.effects (
  applied_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  k          text   NOT NULL,
  seq        bigint NOT NULL,
  message_id text   NOT NULL
);
CREATE FUNCTION %[1]s.apply_event(doc jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF (doc->'payload'->>'seq')::bigint < 0 THEN
    RAISE EXCEPTION 'poison message %%', doc->>'message_id' USING ERRCODE = 'KP001';
  END IF;
  INSERT INTO %[1]s.effects (k, seq, message_id)
  VALUES (doc->>'key', (doc->'payload'->>'seq')::bigint, doc->>'message_id');
END $$;`, db.Schema))
	require.NoError(t, err)
}

// keyedEvent is event number seq (1-based) of key, for topic.
func keyedEvent(topic, key string, seq int64) envelope.Event {
	k := key
	return envelope.Event{
		MessageID:     fmt.Sprintf("%s-%06d", key, seq),
		Source:        "e2e",
		Destination:   topic,
		Key:           &k,
		EventType:     "Counted",
		SchemaVersion: 1,
		ContentType:   envelope.ContentTypeJSON,
		Payload:       []byte(fmt.Sprintf(`{"seq":%d}`, seq)),
		OccurredAt:    time.Now().UTC().Truncate(time.Microsecond),
	}
}

// enqueue writes evs into the outbox in one transaction.
func enqueue(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Store, evs ...envelope.Event) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := ob.EnqueueTx(ctx, tx, evs...); err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// outcome is what the end-of-test checks read from PostgreSQL and Kafka.
type outcome struct {
	effects, distinct int64
	orderViolations   []string
	outboxNotSent     int64
	outboxByStatus    map[string]int64
	inboxNotCompleted int64
	topicRecords      int64
}

// readOutcome checks effects against want (key → number of events enqueued for it).
func readOutcome(t *testing.T, db *testenv.DB, kc *testenv.Kafka, topic string, want map[string]int64) outcome {
	t.Helper()
	ctx := context.Background()
	var o outcome
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM `+db.Schema+`.effects`).Scan(&o.effects, &o.distinct))

	rows, err := db.Pool.Query(ctx, `SELECT k, seq FROM `+db.Schema+`.effects ORDER BY applied_id`)
	require.NoError(t, err)
	applied := map[string][]int64{}
	for rows.Next() {
		var k string
		var s int64
		require.NoError(t, rows.Scan(&k, &s))
		applied[k] = append(applied[k], s)
	}
	require.NoError(t, rows.Err())
	for k, n := range want {
		seqs := applied[k]
		if int64(len(seqs)) != n {
			o.orderViolations = append(o.orderViolations, fmt.Sprintf("%s: %d applied, %d enqueued", k, len(seqs), n))
			continue
		}
		for i, s := range seqs {
			if s != int64(i+1) {
				o.orderViolations = append(o.orderViolations, fmt.Sprintf("%s: applied seq %d at position %d", k, s, i+1))
				break
			}
		}
	}
	for k := range applied {
		if _, ok := want[k]; !ok {
			o.orderViolations = append(o.orderViolations, fmt.Sprintf("%s: applied but never enqueued", k))
		}
	}

	ob, err := outbox.NewAdmin(db.Schema)
	require.NoError(t, err)
	st, err := ob.Overview(ctx, db.Pool)
	require.NoError(t, err)
	o.outboxByStatus = map[string]int64{}
	for _, c := range st.Counts {
		o.outboxByStatus[string(c.Status)] += c.Count
		if c.Status != "sent" {
			o.outboxNotSent += c.Count
		}
	}
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_inbox WHERE status <> 'completed'`).Scan(&o.inboxNotCompleted))

	adm := kadm.NewClient(kc.Client)
	ends, err := adm.ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	ends.Each(func(l kadm.ListedOffset) { o.topicRecords += l.Offset })
	return o
}

// committedAll reports whether group committed every record of topic.
func committedAll(ctx context.Context, adm *kadm.Client, group, topic string) bool {
	gaps, err := commitGaps(ctx, adm, group, topic)
	return err == nil && len(gaps) == 0
}

// commitGaps lists topic's partitions whose records group has not all committed, each as
// "partition: committed/end" (committed -1: none).
func commitGaps(ctx context.Context, adm *kadm.Client, group, topic string) ([]string, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return nil, err
	}
	var gaps []string
	ends.Each(func(o kadm.ListedOffset) {
		c, found := offs.Lookup(o.Topic, o.Partition)
		at := int64(-1)
		if found {
			at = c.At
		}
		if o.Offset > 0 && at != o.Offset {
			gaps = append(gaps, fmt.Sprintf("%d: %d/%d", o.Partition, at, o.Offset))
		}
	})
	slices.Sort(gaps)
	return gaps, nil
}

// consumeAll reads every record of topics from the start until n records were read or the
// timeout passes, and returns them in fetch order.
func consumeAll(t *testing.T, kc *testenv.Kafka, n int, timeout time.Duration, topics ...string) []*kgo.Record {
	t.Helper()
	return kc.ConsumeRecords(t, n, timeout, topics...)
}

// eachKafka runs f on the embedded broker and on the real one (subtests "kfake" and "kafka"),
// in parallel with the package's other parallel tests.
func eachKafka(t *testing.T, f func(t *testing.T, kc *testenv.Kafka)) {
	t.Helper()
	testenv.EachKafka(t, testenv.KafkaConfig{}, func(t *testing.T, kc *testenv.Kafka) { f(t, kc) })
}
