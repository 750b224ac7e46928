package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// rig is a console over a fresh schema and a kfake cluster, served by an httptest server.
type rig struct {
	db     *testenv.DB
	kc     *testenv.Kafka
	srv    *httptest.Server
	con    *console.Console
	outbox *outbox.Store
	inbox  *inbox.Store
	logs   *testenv.LogBuffer
	// fixed makes the inbox handler succeed for poison payloads (a deployed fix).
	fixed bool
	mu    sync.Mutex
}

const consumerName = "billing"

// newRig starts a console with the outbox, inbox (consumer "billing", lag of group
// "billing") and event store configured, unauthenticated (loopback); mod adjusts the config.
func newRig(t *testing.T, mod func(*console.Config)) *rig {
	t.Helper()
	r := &rig{db: testenv.NewDB(t), kc: testenv.NewKafka(t), logs: &testenv.LogBuffer{}}
	var err error
	r.outbox, err = outbox.NewStore(r.db.Schema)
	require.NoError(t, err)
	r.inbox, err = inbox.NewStore(inbox.StoreConfig{Schema: r.db.Schema, Consumer: consumerName, MaxAttempts: 1})
	require.NoError(t, err)
	cfg := console.Config{
		Outbox: &console.OutboxConfig{Pool: r.db.Pool, Schema: r.db.Schema},
		Inbox: &console.InboxConfig{Pool: r.db.Pool, Schema: r.db.Schema, Consumer: consumerName, Handler: r.handle,
			MaxAttempts: 1, Kafka: r.kc.NewClient(t), Group: consumerName},
		Events: &console.EventsConfig{Pool: r.db.Pool, Schema: r.db.Schema},
		Auth:   console.AuthConfig{AllowUnauthenticated: true},
		Logger: slog.New(slog.NewTextHandler(r.logs, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := console.New(cfg)
	require.NoError(t, err)
	r.con = c
	r.srv = httptest.NewServer(c)
	t.Cleanup(r.srv.Close)
	return r
}

// handle is the inbox handler of the tests: a payload containing "poison" fails permanently
// until the rig is fixed.
func (r *rig) handle(_ context.Context, _ pgx.Tx, ev envelope.Event) error {
	r.mu.Lock()
	fixed := r.fixed
	r.mu.Unlock()
	if !fixed && bytes.Contains(ev.Payload, []byte("poison")) {
		return inbox.Permanent(fmt.Errorf("cannot bill %s: payload is poison", ev.MessageID))
	}
	return nil
}

func (r *rig) fix() {
	r.mu.Lock()
	r.fixed = true
	r.mu.Unlock()
}

func ptr[T any](v T) *T { return &v }

func event(id, topic string, key *string, payload string) envelope.Event {
	return envelope.Event{
		MessageID: id, Source: "orders", Destination: topic, Key: key, EventType: "OrderPlaced",
		SchemaVersion: 1, ContentType: "application/json", Payload: []byte(payload),
		OccurredAt: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
	}
}

// enqueue writes events to the outbox and returns their outbox ids.
func (r *rig) enqueue(t *testing.T, evs ...envelope.Event) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	require.NoError(t, pgx.BeginFunc(ctx, r.db.Pool, func(tx pgx.Tx) error {
		res, err := r.outbox.EnqueueTx(ctx, tx, evs...)
		for _, x := range res {
			ids = append(ids, x.OutboxID.String())
		}
		return err
	}))
	return ids
}

// exec runs fixture SQL in the rig's schema.
func (r *rig) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := r.db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// process records a delivery in the inbox through the rig's handler (a poison payload
// becomes a poisoned row, MaxAttempts being 1).
func (r *rig) process(t *testing.T, ev envelope.Event, partition int32, offset int64) inbox.Result {
	t.Helper()
	res, err := r.inbox.Process(context.Background(), r.db.Pool,
		inbox.Delivery{Event: ev, Kafka: &inbox.KafkaRef{Topic: ev.Destination, Partition: partition, Offset: offset}}, r.handle)
	require.NoError(t, err)
	return res
}

// answer is an HTTP response read whole.
type answer struct {
	code   int
	body   string
	header http.Header
}

func (a answer) json(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal([]byte(a.body), v), a.body)
}

// do sends a request to the rig's server; hdr holds extra headers.
func (r *rig) do(t *testing.T, method, path string, body io.Reader, hdr map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(method, r.srv.URL+path, body)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{code: resp.StatusCode, body: string(b), header: resp.Header}
}

func (r *rig) get(t *testing.T, path string) answer {
	t.Helper()
	return r.do(t, http.MethodGet, path, nil, nil)
}

// csrf returns the CSRF token of the anonymous user, from a GET answer's header.
func (r *rig) csrf(t *testing.T) string {
	t.Helper()
	tok := r.get(t, "/api/v1/outbox/summary").header.Get("X-CSRF-Token")
	require.NotEmpty(t, tok)
	return tok
}

// postJSON posts v as JSON with the CSRF header of a GET answer.
func (r *rig) postJSON(t *testing.T, path string, v any) answer {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return r.do(t, http.MethodPost, path, bytes.NewReader(b),
		map[string]string{"Content-Type": "application/json", "X-CSRF-Token": r.csrf(t)})
}

// postForm posts a console form as a same-origin browser would.
func (r *rig) postForm(t *testing.T, path string, form string) answer {
	t.Helper()
	return r.do(t, http.MethodPost, path, strings.NewReader(form), map[string]string{
		"Content-Type": "application/x-www-form-urlencoded", "Origin": r.srv.URL,
	})
}

// follow GETs the Location of a 303 answer, as a browser does after a form post.
func (r *rig) follow(t *testing.T, a answer) answer {
	t.Helper()
	require.Equal(t, http.StatusSeeOther, a.code, a.body)
	loc := a.header.Get("Location")
	require.True(t, strings.HasPrefix(loc, "/console/"), loc)
	return r.get(t, loc)
}

func openPool(t *testing.T, conn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), conn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
