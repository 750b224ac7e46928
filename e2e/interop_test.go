package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// debianPython is Debian's interpreter, for which python3-confluent-kafka is installed (a pyenv
// python3 earlier on PATH cannot import it).
const debianPython = "/usr/bin/python3"

// thirdPartyRecord is a record as kcat or librdkafka's Python binding saw it.
type thirdPartyRecord struct {
	Key       string
	Value     string
	Headers   [][2]string
	Partition int32
	Offset    int64
}

// TestInteropThirdPartyClients: kcat and librdkafka's Python binding read what the relay binary
// published (keys, values and keiro headers in keiro's order), and the records they produce
// with keiro headers are applied by the consumer binary.
func TestInteropThirdPartyClients(t *testing.T) {
	t.Parallel()
	eachKafka(t, testInteropThirdPartyClients)
}

func testInteropThirdPartyClients(t *testing.T, kc *testenv.Kafka) {
	kcat, err := exec.LookPath("kcat")
	require.NoError(t, err, "kcat is required (apt-get install kcat; .ci/run installs it)")
	out, err := exec.Command(debianPython, "-c", "import confluent_kafka").CombinedOutput()
	require.NoError(t, err, "python3-confluent-kafka is required for %s (apt-get install python3-confluent-kafka): %s", debianPython, out)

	ctx := context.Background()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	topic, group := kc.Topic("e2e.interop.v1"), kc.Group("interop")
	kc.CreateTopic(t, topic, 3)
	kc.CreateTopic(t, topic+".dlq", 1)
	brokers := strings.Join(kc.Seeds, ",")

	// Our side publishes: outbox → relay binary.
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	byID := map[string]envelope.Event{}
	var evs []envelope.Event
	want := map[string]int64{}
	for seq := int64(1); seq <= 3; seq++ {
		for k := range 4 {
			ev := keyedEvent(topic, fmt.Sprintf("go-%d", k), seq)
			ev.Attributes = json.RawMessage(`{"tenant":"t1"}`)
			corr := envelope.NewUUIDv7()
			ev.CorrelationID = &corr
			evs = append(evs, ev)
			byID[ev.MessageID] = ev
			want[*ev.Key] = seq
		}
	}
	require.NoError(t, enqueue(ctx, db.Pool, ob, evs...))
	relay := startProc(t, "relay", relayBin, relayAddrRe, relayEnv(db, kc))
	require.Eventually(t, func() bool {
		var sent int64
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.keiro_outbox WHERE status = 'sent'`).Scan(&sent)
		return sent == int64(len(evs))
	}, 60*time.Second, 50*time.Millisecond, "relay published:\n%s", relay.log())
	require.Equal(t, 0, relay.term(t, 30*time.Second), relay.log())

	checkRead := func(client string, recs []thirdPartyRecord) {
		t.Helper()
		require.Len(t, recs, len(evs), client)
		lastSeq := map[string]int64{}
		lastOffset := map[string]int64{}
		for _, r := range recs {
			hdr := map[string]string{}
			var names []string
			for _, h := range r.Headers {
				hdr[h[0]] = h[1]
				names = append(names, h[0])
			}
			ev, ok := byID[hdr[envelope.HeaderMessageID]]
			require.True(t, ok, "%s: unknown message id in %v", client, r.Headers)
			require.Equal(t, *ev.Key, r.Key, client)
			require.Equal(t, string(ev.Payload), r.Value, client)
			var wantNames []string
			for _, h := range ev.Headers() {
				wantNames = append(wantNames, h.Key)
				require.Equal(t, string(h.Value), hdr[h.Key], "%s: header %s", client, h.Key)
			}
			require.Equal(t, wantNames, names, "%s: keiro's header order", client)
			// Per key, later events sit later in the partition.
			var s struct{ Seq int64 }
			require.NoError(t, json.Unmarshal([]byte(r.Value), &s))
			if prev, ok := lastOffset[r.Key]; ok && r.Offset > prev {
				require.Greater(t, s.Seq, lastSeq[r.Key], "%s: order of key %s", client, r.Key)
			}
			if prev, ok := lastOffset[r.Key]; !ok || r.Offset > prev {
				lastOffset[r.Key], lastSeq[r.Key] = r.Offset, s.Seq
			}
		}
	}

	// kcat reads.
	kout, err := exec.Command(kcat, "-C", "-b", brokers, "-t", topic, "-o", "beginning", "-e", "-q", "-J").Output()
	require.NoError(t, err, "kcat -C: %s", exitStderr(err))
	var kcatRecs []thirdPartyRecord
	for _, line := range bytes.Split(bytes.TrimSpace(kout), []byte("\n")) {
		var j struct {
			Partition int32    `json:"partition"`
			Offset    int64    `json:"offset"`
			Key       string   `json:"key"`
			Payload   string   `json:"payload"`
			Headers   []string `json:"headers"`
		}
		require.NoError(t, json.Unmarshal(line, &j), "kcat line %s", line)
		r := thirdPartyRecord{Key: j.Key, Value: j.Payload, Partition: j.Partition, Offset: j.Offset}
		for i := 0; i+1 < len(j.Headers); i += 2 {
			r.Headers = append(r.Headers, [2]string{j.Headers[i], j.Headers[i+1]})
		}
		kcatRecs = append(kcatRecs, r)
	}
	checkRead("kcat", kcatRecs)

	// librdkafka's Python binding reads.
	script := filepath.Join("testdata", "interop.py")
	pout, err := exec.Command(debianPython, script, "consume", brokers, topic, fmt.Sprint(len(evs))).Output()
	require.NoError(t, err, "interop.py consume: %s", exitStderr(err))
	var pyRecs []thirdPartyRecord
	for _, line := range bytes.Split(bytes.TrimSpace(pout), []byte("\n")) {
		var j struct {
			Key, Value string
			Headers    [][2]string
			Partition  int32
			Offset     int64
		}
		require.NoError(t, json.Unmarshal(line, &j), "python line %s", line)
		pyRecs = append(pyRecs, thirdPartyRecord{Key: j.Key, Value: j.Value, Headers: j.Headers, Partition: j.Partition, Offset: j.Offset})
	}
	checkRead("python", pyRecs)

	// They produce records with keiro headers; our consumer applies them.
	for seq := int64(1); seq <= 2; seq++ {
		ev := keyedEvent(topic, "kcat-k", seq)
		args := []string{"-P", "-b", brokers, "-t", topic, "-k", *ev.Key, "-X", "partitioner=murmur2_random"}
		for _, h := range ev.Headers() {
			args = append(args, "-H", h.Key+"="+string(h.Value))
		}
		cmd := exec.Command(kcat, args...)
		cmd.Stdin = bytes.NewReader(append(ev.Payload, '\n'))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "kcat -P: %s", out)
		want[*ev.Key] = seq
	}
	var lines bytes.Buffer
	for seq := int64(1); seq <= 3; seq++ {
		ev := keyedEvent(topic, "py-k", seq)
		var hs [][2]string
		for _, h := range ev.Headers() {
			hs = append(hs, [2]string{h.Key, string(h.Value)})
		}
		b, err := json.Marshal(map[string]any{"key": *ev.Key, "value": string(ev.Payload), "headers": hs})
		require.NoError(t, err)
		lines.Write(append(b, '\n'))
		want[*ev.Key] = seq
	}
	py := exec.Command(debianPython, script, "produce", brokers, topic)
	py.Stdin = &lines
	pyOut, err := py.CombinedOutput()
	require.NoError(t, err, "interop.py produce: %s", pyOut)

	cons := startProc(t, "consumer", consumerBin, consumerAddrRe, consumerEnv(db, kc, group, topic))
	adm := kadm.NewClient(kc.Client)
	total := int64(len(evs) + 2 + 3)
	require.Eventually(t, func() bool {
		var n int64
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.effects`).Scan(&n)
		return n >= total && committedAll(ctx, adm, group, topic)
	}, 60*time.Second, 50*time.Millisecond, "consumer applied every record:\n%s", cons.log())
	require.Equal(t, 0, cons.term(t, 30*time.Second), cons.log())

	o := readOutcome(t, db, kc, topic, want)
	require.Equal(t, total, o.effects)
	require.Equal(t, total, o.distinct)
	require.Empty(t, o.orderViolations)
	require.Zero(t, o.inboxNotCompleted)
}

func exitStderr(err error) string {
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	if err != nil {
		return err.Error()
	}
	return ""
}
