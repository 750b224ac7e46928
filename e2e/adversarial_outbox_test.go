package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// Outbox rows written by plain SQL (the writers the docs support besides EnqueueTx and
// <schema>.enqueue), in claim mode (INSERT into keiro_outbox) and in log mode (INSERT into
// keiro_outbox_log), published by the relay binary. Each bad row is followed by a good row of
// its (source, key) and a good row of another key.

// destKind is what a row's destination is.
type destKind int

const (
	destGood    destKind = iota // the test's topic
	destIllegal                 // not a legal Kafka topic name
	destUnknown                 // a legal name that was never created
)

// outboxRow is one plain INSERT's columns (keiro_outbox_log's, which are keiro_outbox's event).
type outboxRow struct {
	Source, MessageID, Destination                   string
	Key                                              *string
	EventType, ContentType                           string
	SchemaVersion                                    int64
	SchemaRegistry, SchemaSubject, SchemaFingerprint *string
	SchemaVersionRef, SchemaID, SourceGlobalPosition *int64
	Traceparent, Tracestate                          *string
	Payload                                          []byte
	Attributes                                       *string // jsonb text
	OccurredAt                                       time.Time
}

// outboxCase is one bad row. Its message id is tag(i) followed by IDSuffix, and its destination
// is resolved from Dest and DestName when the test knows its topics.
type outboxCase struct {
	Name     string
	Row      outboxRow
	IDSuffix string
	Dest     destKind
	DestName string // the illegal name, or the unknown topic's base name
}

// hugePayload is over every record limit on the way (the producer's 1,000,012-byte batch, a
// broker's default 1 MiB).
const hugePayload = 1_100_000

// publishable reports whether the row must reach the topic: a legal, existing destination and a
// record under the limits. Otherwise it must end dead or rejected with a reason.
func (c outboxCase) publishable() bool { return c.Dest == destGood && len(c.Row.Payload) < hugePayload }

func (c outboxCase) String() string {
	return fmt.Sprintf("%s: source=%s id=%s dest=%s key=%s type=%s ctype=%s payload=%d bytes attrs=%s tp=%s",
		c.Name, shown(c.Row.Source), shown(c.Row.MessageID), shown(c.Row.Destination), shown(c.Row.Key),
		shown(c.Row.EventType), shown(c.Row.ContentType), len(c.Row.Payload), shown(c.Row.Attributes), shown(c.Row.Traceparent))
}

func ptr[T any](v T) *T { return &v }

// baseRow is a well-formed row; the cases change what they test.
func baseRow() outboxRow {
	return outboxRow{Source: "adv", EventType: "Counted", SchemaVersion: 1, ContentType: envelope.ContentTypeJSON,
		Payload: []byte(`{"seq":0}`), OccurredAt: time.Now().UTC().Truncate(time.Microsecond)}
}

// fixedOutboxCases are the nasty rows every run tries.
func fixedOutboxCases() []outboxCase {
	with := func(name string, f func(c *outboxCase)) outboxCase {
		c := outboxCase{Name: name, Row: baseRow()}
		c.Row.Key = ptr("k-" + strings.ReplaceAll(name, " ", "-"))
		f(&c)
		return c
	}
	ctl := "a\r\nb\x01\x1b[31m\x7fc"
	return []outboxCase{
		with("every column empty", func(c *outboxCase) {
			c.Row = outboxRow{Key: ptr(""), Payload: []byte{}, OccurredAt: time.Now().UTC()}
			c.Dest, c.DestName = destIllegal, ""
		}),
		with("illegal topic bad topic!", func(c *outboxCase) { c.Dest, c.DestName = destIllegal, "bad topic!" }),
		with("illegal topic of 250 chars", func(c *outboxCase) { c.Dest, c.DestName = destIllegal, strings.Repeat("t", 250) }),
		with("illegal topic ..", func(c *outboxCase) { c.Dest, c.DestName = destIllegal, ".." }),
		with("illegal topic with newline", func(c *outboxCase) { c.Dest, c.DestName = destIllegal, "adv\nx" }),
		with("unknown topic", func(c *outboxCase) { c.Dest, c.DestName = destUnknown, "adv.never-created" }),
		with("huge payload", func(c *outboxCase) { c.Row.Payload = bytes.Repeat([]byte("x"), hugePayload) }),
		with("control characters in every text column", func(c *outboxCase) {
			c.Row.Source, c.IDSuffix, c.Row.Key = "src"+ctl, ctl, ptr(ctl)
			c.Row.EventType, c.Row.ContentType = ctl, ctl
			c.Row.SchemaRegistry, c.Row.SchemaSubject, c.Row.SchemaFingerprint = ptr(ctl), ptr(ctl), ptr(ctl)
			c.Row.Traceparent, c.Row.Tracestate = ptr(ctl), ptr(ctl)
		}),
		with("empty key", func(c *outboxCase) { c.Row.Key = ptr("") }),
		with("one-byte key", func(c *outboxCase) { c.Row.Key = ptr("\x01") }),
		with("10 KB key", func(c *outboxCase) { c.Row.Key = ptr(repeatTo("kéy\x01", 10<<10)) }),
		with("10 KB message id", func(c *outboxCase) { c.IDSuffix = repeatTo("id\r\n", 10<<10) }),
		with("binary payload", func(c *outboxCase) {
			c.Row.Payload, c.Row.ContentType = []byte{0, 0xff, 0xfe, 0, 1, 0x80}, "application/octet-stream"
		}),
		with("JSON content type, payload not JSON", func(c *outboxCase) { c.Row.Payload = []byte("{not json\x00") }),
		with("junk attributes and trace", func(c *outboxCase) {
			c.Row.Attributes = ptr(`{"a\n":"\u0001\u001b","b":[null,{"c":"\ud83d\ude00"}]}`)
			c.Row.Traceparent, c.Row.Tracestate = ptr("00-zz-zz-zz"), ptr("=,=,")
		}),
		with("extreme numbers and times", func(c *outboxCase) {
			c.Row.SchemaVersion, c.Row.SchemaID, c.Row.SchemaVersionRef = -1<<63, ptr(int64(-1)), ptr(int64(1<<63-1))
			c.Row.SourceGlobalPosition = ptr(int64(-1 << 63))
			c.Row.OccurredAt = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
		}),
		with("year 9999", func(c *outboxCase) { c.Row.OccurredAt = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC) }),
	}
}

// outboxCaseGen generates bad rows: every column drawn from junk, empty, maximum or illegal
// values, the destination legal, illegal or unknown, the payload small, 10 KB or huge.
var outboxCaseGen = rapid.Custom(func(t *rapid.T) outboxCase {
	c := outboxCase{Name: "generated", Row: baseRow()}
	r := &c.Row
	text := junkText(24)
	opt := func(label string) *string {
		if rapid.Bool().Draw(t, label+" set") {
			return ptr(text.Draw(t, label))
		}
		return nil
	}
	r.Source = rapid.OneOf(rapid.Just("adv"), text).Draw(t, "source")
	c.IDSuffix = rapid.OneOf(text, rapid.Just(repeatTo("ü\t", 10<<10))).Draw(t, "id suffix")
	switch rapid.IntRange(0, 3).Draw(t, "destination kind") {
	case 0, 1:
		c.Dest = destGood
	case 2:
		c.Dest = destIllegal
		c.DestName = rapid.SampledFrom([]string{"", ".", "..", "bad topic!", strings.Repeat("x", 250), "a/b", "ü"}).Draw(t, "illegal")
	default:
		c.Dest = destUnknown
		c.DestName = "adv.unknown-" + rapid.StringMatching(`[a-z0-9]{1,12}`).Draw(t, "unknown")
	}
	switch rapid.IntRange(0, 4).Draw(t, "key kind") {
	case 0:
		r.Key = nil
	case 1:
		r.Key = ptr(repeatTo("k\x01é", sizeOf(t, "key size")))
	default:
		r.Key = ptr(text.Draw(t, "key"))
	}
	r.EventType = rapid.OneOf(rapid.Just("Counted"), text).Draw(t, "event type")
	r.ContentType = rapid.OneOf(rapid.Just(envelope.ContentTypeJSON), rapid.Just("application/octet-stream"), text).Draw(t, "content type")
	r.SchemaVersion = rapid.Int64().Draw(t, "schema version")
	r.SchemaRegistry, r.SchemaSubject, r.SchemaFingerprint = opt("registry"), opt("subject"), opt("fingerprint")
	if rapid.Bool().Draw(t, "schema id set") {
		r.SchemaID = ptr(rapid.Int64().Draw(t, "schema id"))
	}
	r.Traceparent = rapid.OneOf(rapid.Just[*string](nil), rapid.Just(ptr("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")),
		rapid.Map(text, func(s string) *string { return &s })).Draw(t, "traceparent")
	if r.Traceparent != nil {
		r.Tracestate = opt("tracestate")
	}
	switch rapid.IntRange(0, 7).Draw(t, "payload kind") {
	case 0:
		r.Payload = bytes.Repeat([]byte("h"), hugePayload)
	case 1:
		r.Payload = bytes.Repeat([]byte{0xff, 0}, 5<<10)
	default:
		r.Payload = junkBytes(64).Draw(t, "payload")
	}
	if rapid.Bool().Draw(t, "attributes set") {
		b, _ := json.Marshal(map[string]string{text.Draw(t, "attribute name"): text.Draw(t, "attribute value")})
		r.Attributes = ptr(string(b))
	}
	r.OccurredAt = rapid.SampledFrom([]time.Time{time.Now().UTC().Truncate(time.Microsecond), time.Unix(0, 0).UTC(),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)}).Draw(t, "occurred at")
	return c
})

// refusal is a row the database itself refuses at INSERT: a clear refusal at the boundary.
type refusal struct {
	name string
	f    func(r *outboxRow)
	// claimOnly: keiro_outbox_log has no such constraint (the status column).
	claimOnly bool
	// status is the status column written (claim mode), "" for the default.
	status string
}

var outboxRefusals = []refusal{
	{name: "NUL in the message id", f: func(r *outboxRow) { r.MessageID += "\x00" }},
	{name: "NUL in the key", f: func(r *outboxRow) { r.Key = ptr("k\x00") }},
	{name: "invalid UTF-8 in the source", f: func(r *outboxRow) { r.Source = "adv\xff\xfe" }},
	{name: "attributes that are not JSON", f: func(r *outboxRow) { r.Attributes = ptr("{not json") }},
	{name: "attributes with a NUL escape", f: func(r *outboxRow) { r.Attributes = ptr(`{"a":"\u0000"}`) }},
	{name: "a status outside the CHECK", f: func(r *outboxRow) {}, claimOnly: true, status: "bogus"},
}

// adversarialOutbox is the setup of both modes: a topic, the cases and their good rows, the
// relay, and the check of the invariant.
type adversarialOutbox struct {
	t     *testing.T
	db    *testenv.DB
	kc    *testenv.Kafka
	topic string
	table string // keiro_outbox or keiro_outbox_log
	cases []outboxCase
	goods []outboxRow // two per case: same (source, key), then another key
	relay *proc
}

func newAdversarialOutbox(t *testing.T, kc *testenv.Kafka, table string) *adversarialOutbox {
	a := &adversarialOutbox{t: t, db: testenv.NewDB(t), kc: kc, topic: kc.Topic("adv.outbox"), table: table}
	kc.CreateTopic(t, a.topic, 1)
	seed := adversarialSeed(t)
	cases := append(fixedOutboxCases(), generate(outboxCaseGen, seed, adversarialN(t, 6))...)
	for i := range cases {
		c := &cases[i]
		c.Row.MessageID = tag(i) + c.IDSuffix
		switch c.Dest {
		case destGood:
			c.Row.Destination = a.topic
		case destIllegal:
			c.Row.Destination = c.DestName
		case destUnknown:
			c.Row.Destination = kc.Topic(c.DestName)
		}
		g := baseRow()
		g.Source, g.Key, g.MessageID, g.Destination = c.Row.Source, c.Row.Key, "good-"+tag(i)+"-same-key", a.topic
		g.Payload = []byte(fmt.Sprintf(`{"case":%d,"good":1}`, i))
		o := baseRow()
		o.Key, o.MessageID, o.Destination = ptr("other-"+tag(i)), "good-"+tag(i)+"-other-key", a.topic
		o.Payload = []byte(fmt.Sprintf(`{"case":%d,"good":2}`, i))
		a.goods = append(a.goods, g, o)
	}
	a.cases = cases
	return a
}

// insert writes r with a plain INSERT of its own transaction.
func (a *adversarialOutbox) insert(ctx context.Context, r outboxRow, status string) error {
	cols := `outbox_id, message_id, source, destination, message_key, event_type, schema_version,
        content_type, schema_registry, schema_subject, schema_version_ref, schema_id, schema_fingerprint,
        source_global_position, traceparent, tracestate, payload_bytes, attributes, occurred_at`
	vals := `gen_random_uuid(), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17::jsonb, $18`
	args := []any{r.MessageID, r.Source, r.Destination, r.Key, r.EventType, r.SchemaVersion, r.ContentType,
		r.SchemaRegistry, r.SchemaSubject, r.SchemaVersionRef, r.SchemaID, r.SchemaFingerprint,
		r.SourceGlobalPosition, r.Traceparent, r.Tracestate, r.Payload, r.Attributes, r.OccurredAt}
	if status != "" {
		cols += ", status"
		vals += ", $19"
		args = append(args, status)
	}
	_, err := a.db.Pool.Exec(ctx, `INSERT INTO `+a.db.Schema+`.`+a.table+` (`+cols+`) VALUES (`+vals+`)`, args...)
	return err
}

// refusedTraces counts the rows of keiro_outbox and keiro_outbox_log that a refused INSERT
// could have left: a refused row's message id, or a changed duplicate's payload. It counts
// those rows alone, since a log-mode relay writes rows of its own (the dead list) meanwhile.
func (a *adversarialOutbox) refusedTraces(ctx context.Context, changed []byte) int64 {
	var n int64
	q := `SELECT (SELECT count(*) FROM %[1]s.keiro_outbox WHERE message_id LIKE 'refused-%%' OR payload_bytes = $1)
        + (SELECT count(*) FROM %[1]s.keiro_outbox_log WHERE message_id LIKE 'refused-%%' OR payload_bytes = $1)`
	require.NoError(a.t, a.db.Pool.QueryRow(ctx, fmt.Sprintf(q, a.db.Schema), changed).Scan(&n))
	return n
}

// writeRows inserts every case's bad row and its good rows, and checks that the rows the
// database refuses are refused with an error and leave no trace.
func (a *adversarialOutbox) writeRows(ctx context.Context) {
	t := a.t
	for i, c := range a.cases {
		require.NoError(t, a.insert(ctx, c.Row, ""), "case %d %s", i, c)
		require.NoError(t, a.insert(ctx, a.goods[2*i], ""), "good row of case %d", i)
		require.NoError(t, a.insert(ctx, a.goods[2*i+1], ""), "other-key row of case %d", i)
	}
	for j, rf := range outboxRefusals {
		if rf.claimOnly && a.table != "keiro_outbox" {
			continue
		}
		r := baseRow()
		r.MessageID, r.Destination, r.Key = fmt.Sprintf("refused-%d", j), a.topic, ptr("refused")
		rf.f(&r)
		err := a.insert(ctx, r, rf.status)
		require.Error(t, err, "refusal %q: the database must refuse the row at INSERT", rf.name)
		t.Logf("refusal %q: %v", rf.name, err)
	}
	// A duplicate (source, message id) with other content.
	dup := a.goods[0]
	dup.Payload = []byte(`{"changed":true}`)
	require.Error(t, a.insert(ctx, dup, ""), "a changed duplicate of a row must be refused (the identity constraint)")
	require.Zero(t, a.refusedTraces(ctx, dup.Payload), "a refused INSERT leaves no row")
}

// relayMaxAttempts is the relay's retry budget in the suite.
const relayMaxAttempts = 2

// startRelay starts the relay binary with a small retry budget: two attempts, short backoffs.
func (a *adversarialOutbox) startRelay(extra ...string) {
	env := relayEnv(a.db, a.kc, append([]string{fmt.Sprintf("KEIRO_RELAY_MAX_ATTEMPTS=%d", relayMaxAttempts), "KEIRO_RELAY_BACKOFF_INITIAL=50ms",
		"KEIRO_RELAY_BACKOFF_MAX=200ms", "KEIRO_RELAY_POLL_INTERVAL=100ms"}, extra...)...)
	a.relay = startProc(a.t, "relay", relayBin, relayAddrRe, env)
	a.relay.waitAddr(a.t, 30*time.Second)
}

// published is what the test's topic holds, by message id.
func (a *adversarialOutbox) published(ctx context.Context) (map[string][]*kgo.Record, []*kgo.Record, error) {
	recs, err := a.kc.ReadTopic(ctx, a.topic)
	if err != nil {
		return nil, nil, err
	}
	byID := map[string][]*kgo.Record{}
	for _, r := range recs {
		id := ""
		for _, h := range r.Headers {
			if h.Key == envelope.HeaderMessageID {
				id = string(h.Value)
				break
			}
		}
		byID[id] = append(byID[id], r)
	}
	return byID, recs, nil
}

// deadRows is the outbox's dead listing (what `relay dead list` shows), by message id.
func (a *adversarialOutbox) deadRows(ctx context.Context) (map[string]outbox.DeadRow, error) {
	st, err := outbox.NewAdmin(a.db.Schema)
	if err != nil {
		return nil, err
	}
	dead, err := st.ListDead(ctx, a.db.Pool, outbox.ListDeadOptions{Limit: 100_000})
	if err != nil {
		return nil, err
	}
	out := map[string]outbox.DeadRow{}
	for _, d := range dead {
		out[d.MessageID] = d
	}
	return out, nil
}

// check waits until every bad row is published or dead with a reason and every good row is
// published, then checks that nothing is duplicated, reordered or published that must not be.
func (a *adversarialOutbox) check(ctx context.Context) {
	t := a.t
	var byID map[string][]*kgo.Record
	var all []*kgo.Record
	var dead map[string]outbox.DeadRow
	waitState(t, 90*time.Second, "every bad row published or dead with a reason, every good row published", func() (bool, string) {
		var err error
		if byID, all, err = a.published(ctx); err != nil {
			return false, err.Error()
		}
		if dead, err = a.deadRows(ctx); err != nil {
			return false, err.Error()
		}
		var open []string
		for i, c := range a.cases {
			d, isDead := dead[c.Row.MessageID]
			switch {
			case c.publishable() && len(byID[c.Row.MessageID]) == 0:
				state := "not published"
				if isDead {
					state = fmt.Sprintf("%s: %s %s", d.Status, d.RejectionCode, d.LastError)
				}
				open = append(open, fmt.Sprintf("case %d (%s): must be published: %s", i, c, state))
			case !c.publishable() && (!isDead || d.LastError == ""):
				open = append(open, fmt.Sprintf("case %d (%s): must be dead or rejected with a reason; %s", i, c, a.rowState(ctx, c.Row)))
			}
			for _, g := range a.goods[2*i : 2*i+2] {
				if len(byID[g.MessageID]) == 0 {
					open = append(open, fmt.Sprintf("case %d: good row %s not published; %s", i, g.MessageID, a.rowState(ctx, g)))
				}
			}
		}
		return len(open) == 0, fmt.Sprintf("%d of %d cases open:\n%s\nrelay log:\n%s", len(open), len(a.cases),
			strings.Join(open, "\n"), logTail(a.relay))
	})

	// Nothing published twice or published that must not be; each publishable row's bytes as
	// written; per (source, key) the bad row before its good row.
	want := map[string]outboxRow{}
	for i, c := range a.cases {
		if c.publishable() {
			want[c.Row.MessageID] = c.Row
		} else {
			require.Empty(t, byID[c.Row.MessageID], "case %d (%s) must not be published", i, c)
			d := dead[c.Row.MessageID]
			require.LessOrEqual(t, d.Attempts, relayMaxAttempts, "case %d (%s) used more than its attempts", i, c)
			if len(c.Row.Payload) >= hugePayload && c.Dest == destGood {
				require.Equal(t, "message_too_large", d.RejectionCode, "case %d (%s): %s", i, c, d.LastError)
			}
		}
		for _, g := range a.goods[2*i : 2*i+2] {
			want[g.MessageID] = g
			_, isDead := dead[g.MessageID]
			require.False(t, isDead, "good row %s is dead", g.MessageID)
		}
	}
	for id, recs := range byID {
		row, ok := want[id]
		require.True(t, ok, "published %s, which no case wrote or which must not be published", shown(id))
		require.Len(t, recs, 1, "message %s published %d times", shown(id), len(recs))
		r := recs[0]
		require.Equal(t, row.Payload, r.Value, "payload of %s", shown(id))
		if row.Key == nil {
			require.Nil(t, r.Key, "key of %s", shown(id))
		} else {
			require.Equal(t, []byte(*row.Key), r.Key, "key of %s", shown(id))
		}
	}
	require.Len(t, all, len(want), "records on the topic")
	for i, c := range a.cases {
		if c.publishable() && c.Row.Key != nil {
			bad, good := byID[c.Row.MessageID][0], byID[a.goods[2*i].MessageID][0]
			require.Less(t, bad.Offset, good.Offset, "case %d (%s): its (source, key) reordered", i, c)
		}
	}
	a.checkDeadListing(ctx)
}

// rowState describes where a row is, for a failure message.
func (a *adversarialOutbox) rowState(ctx context.Context, r outboxRow) string {
	var status, lastErr, code string
	var attempts int
	err := a.db.Pool.QueryRow(ctx, `SELECT status, attempt_count, coalesce(last_error, ''), coalesce(rejection_code, '')
        FROM `+a.db.Schema+`.keiro_outbox WHERE source = $1 AND message_id = $2`, r.Source, r.MessageID).Scan(&status, &attempts, &lastErr, &code)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "no keiro_outbox row"
	case err != nil:
		return err.Error()
	}
	return fmt.Sprintf("keiro_outbox: %s after %d attempts %s %s", status, attempts, code, shown(lastErr))
}

// checkDeadListing runs `relay dead list --json` and checks that every row that must not be
// published is listed with its reason: what an operator sees.
func (a *adversarialOutbox) checkDeadListing(ctx context.Context) {
	t := a.t
	p := startProc(t, "relay dead list", relayBin, relayAddrRe, []string{
		"KEIRO_RELAY_DATABASE_URL=" + testenv.DatabaseURL(), "KEIRO_RELAY_SCHEMA=" + a.db.Schema,
	}, "dead", "list", "--json", "--limit=100000", "--log-level=error")
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("relay dead list did not finish within 30s:\n%s", p.log())
	}
	require.Equal(t, 0, p.exitCode(), p.log())
	listed := map[string]string{}
	for _, line := range strings.Split(p.log(), "\n") {
		var row struct {
			MessageID     string `json:"message_id"`
			Status        string `json:"status"`
			LastError     string `json:"last_error"`
			RejectionCode string `json:"rejection_code"`
		}
		if json.Unmarshal([]byte(line), &row) == nil && row.Status != "" {
			listed[row.MessageID] = row.Status + ": " + row.RejectionCode + " " + row.LastError
		}
	}
	for i, c := range a.cases {
		if !c.publishable() {
			require.Contains(t, listed, c.Row.MessageID, "case %d (%s) is not in relay dead list", i, c)
		}
	}
}

// TestAdversarialOutboxClaim: rows written by plain INSERT into keiro_outbox, published by a
// claim-mode relay binary.
func TestAdversarialOutboxClaim(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{DisableAutoCreate: true}, func(t *testing.T, kc *testenv.Kafka) {
		ctx := context.Background()
		a := newAdversarialOutbox(t, kc, "keiro_outbox")
		a.writeRows(ctx)
		a.startRelay()
		a.check(ctx)
		require.Equal(t, 0, a.relay.term(t, 30*time.Second), logTail(a.relay))
	})
}

// TestAdversarialOutboxLog: rows written by plain INSERT into keiro_outbox_log, published by a
// log-mode relay binary from its replication slot. A row that cannot be published becomes a
// rejected row of keiro_outbox (relay dead list), and the slot moves on.
func TestAdversarialOutboxLog(t *testing.T) {
	t.Parallel()
	testenv.EachKafka(t, testenv.KafkaConfig{DisableAutoCreate: true}, func(t *testing.T, kc *testenv.Kafka) {
		ctx := context.Background()
		a := newAdversarialOutbox(t, kc, "keiro_outbox_log")
		slot := outbox.DefaultLogSlot(a.db.Schema)
		t.Cleanup(func() { dropSlot(t, a.db, slot) }) // after the relay's kill (cleanups run last first)
		a.startRelay("KEIRO_RELAY_MODE=log", "KEIRO_RELAY_LOG_SLOT="+slot)
		admin, err := outbox.NewAdmin(a.db.Schema)
		require.NoError(t, err)
		waitState(t, 30*time.Second, "the relay switched the schema to log mode", func() (bool, string) {
			m, err := admin.Mode(ctx, a.db.Pool)
			if err != nil {
				return false, err.Error()
			}
			return m == outbox.ModeLog, fmt.Sprintf("mode %s\n%s", m, logTail(a.relay))
		})
		a.writeRows(ctx)
		var written string
		require.NoError(t, a.db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&written))
		a.check(ctx)
		// The slot moves on past every row: no WAL is retained for a row that cannot be published.
		waitState(t, 30*time.Second, "the slot confirmed past the rows written", func() (bool, string) {
			var confirmed string
			var past bool
			err := a.db.Pool.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn::text, ''), coalesce(confirmed_flush_lsn >= $2::pg_lsn, false)
                FROM pg_replication_slots WHERE slot_name = $1`, slot, written).Scan(&confirmed, &past)
			if err != nil {
				return false, err.Error()
			}
			return past, fmt.Sprintf("slot %s confirmed %s, rows written up to %s\n%s", slot, confirmed, written, logTail(a.relay))
		})
		require.Equal(t, 0, a.relay.term(t, 30*time.Second), logTail(a.relay))
	})
}
