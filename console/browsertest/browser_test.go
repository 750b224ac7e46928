package browsertest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/internal/httpserver"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// chromiumPath finds Debian's chromium; the browser test fails without it (.ci/run installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("KEIRO_TEST_CHROMIUM"), "/usr/bin/chromium"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	t.Fatal("chromium is not installed: the console's browser test needs it (apt-get install chromium, as .ci/run does; or set KEIRO_TEST_CHROMIUM)")
	return ""
}

// artifactsDir is where screenshots go: $KEIRO_TEST_ARTIFACTS/console, or a temporary directory.
func artifactsDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("KEIRO_TEST_ARTIFACTS"); d != "" {
		dir := filepath.Join(d, "console")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		return dir
	}
	return t.TempDir()
}

// signal counts events and wakes waiters.
type signal struct {
	mu sync.Mutex
	n  map[string]int64
	ch chan struct{}
}

func newSignal() *signal { return &signal{n: map[string]int64{}, ch: make(chan struct{}, 1)} }

func (s *signal) add(k string, d int64) {
	s.mu.Lock()
	s.n[k] += d
	s.mu.Unlock()
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

func (s *signal) wait(t *testing.T, k string, n int64, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		have := s.n[k]
		s.mu.Unlock()
		if have >= n {
			return
		}
		select {
		case <-s.ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %d %s; have %d", n, k, have)
		}
	}
}

// TestBrowserConsole drives the console in headless Chromium: a relay with a dead row, a
// consumer with a poisoned message and a stuck partition; the operator finds the row from the
// header's search box, requeues it from a confirmation that shows what is requeued (the relay
// publishes it) and retries the message. The header is checked at a phone's 390 px and the dark
// theme under prefers-color-scheme: dark. Screenshots of each page are saved.
func TestBrowserConsole(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	shots := artifactsDir(t)
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "orders.v1", 2)
	kc.CreateTopic(t, "payments.v1", 1)
	kc.CreateTopic(t, "shipments.v1", 1)
	kc.CreateTopic(t, "orders.v1.dlq", 1)
	logs := &testenv.LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	sig := newSignal()

	// The broker refuses payments.v1 until the operator's fix (produce requests name topics by id).
	topics, err := kadm.NewClient(kc.NewClient(t)).ListTopics(context.Background(), "payments.v1")
	require.NoError(t, err)
	paymentsID := topics["payments.v1"].ID
	var brokerFixed atomic.Bool
	kc.Cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		for _, tp := range req.Topics {
			if (tp.Topic == "payments.v1" || tp.TopicID == paymentsID) && !brokerFixed.Load() {
				return testenv.ProduceError(req, kerr.UnknownServerError.Code), nil, true
			}
		}
		return nil, nil, false
	})

	// The relay.
	var store *outbox.Store
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	store, err = outbox.NewStore(db.Schema)
	require.NoError(t, err)
	// The relay's own pool carries its application_name, as the sidecar's does.
	relayPool := openPool(t, db.ConnString+"&application_name="+url.QueryEscape(outbox.ApplicationName(db.Schema)))
	relay, err := outbox.NewRelay(relayPool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{
		Schema: db.Schema, MaxAttempts: 1, PollInterval: 50 * time.Millisecond, Logger: log,
		OnBatch: func(b outbox.BatchResult) {
			sig.add("published", int64(b.Published))
			sig.add("dead", int64(b.Dead))
		},
	})
	require.NoError(t, err)
	wg.Go(func() {
		if err := relay.Run(ctx); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	pay := envelope.Event{MessageID: "pay-1042", Source: "billing", Destination: "payments.v1", Key: ptr("customer-7"),
		EventType: "PaymentCaptured", SchemaVersion: 2, ContentType: "application/json",
		Payload:    []byte(`{"payment_id":"pay-1042","amount":{"currency":"EUR","value":"129.90"},"note":"<script>alert('x')</script>"}`),
		OccurredAt: time.Now().UTC(), CorrelationID: ptr(envelope.UUID{1, 2, 3, 4}),
	}
	var evs []envelope.Event
	for i := range 3 {
		evs = append(evs, envelope.Event{MessageID: fmt.Sprintf("ship-%d", i), Source: "shipping", Destination: "shipments.v1",
			Key: ptr(fmt.Sprintf("order-%d", i)), EventType: "ShipmentBooked", SchemaVersion: 1, ContentType: "application/json",
			Payload: []byte(fmt.Sprintf(`{"order":%d}`, i)), OccurredAt: time.Now().UTC()})
	}
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := store.EnqueueTx(ctx, tx, append(evs, pay)...)
		return err
	}))
	t.Cleanup(func() {
		if t.Failed() {
			rows, _ := db.Pool.Query(context.Background(), "SELECT message_id, status, attempt_count, coalesce(last_error, '') FROM keiro_outbox")
			for rows.Next() {
				var a, b, d string
				var c int
				_ = rows.Scan(&a, &b, &c, &d)
				t.Log(a, b, c, d)
			}
			rows.Close()
			t.Log(logs.String())
		}
	})
	sig.wait(t, "dead", 1, 30*time.Second)
	sig.wait(t, "published", 3, 30*time.Second)

	// The consumer: "poison" fails permanently until fixed; "block" holds partition 1.
	var handlerFixed atomic.Bool
	release := make(chan struct{})
	handle := func(hctx context.Context, _ pgx.Tx, ev envelope.Event) error {
		switch {
		case bytes.Contains(ev.Payload, []byte("poison")) && !handlerFixed.Load():
			return inbox.Permanent(errors.New("invoice rejected: customer 7 has no billing address"))
		case bytes.Contains(ev.Payload, []byte("block")):
			select {
			case <-release:
			case <-hctx.Done():
				return hctx.Err()
			}
		}
		return nil
	}
	consumer, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: consumerName, Topics: []string{"orders.v1"},
		Store:           inbox.StoreConfig{Schema: db.Schema, Consumer: consumerName, MaxAttempts: 1},
		DeadLetterTopic: "orders.v1.dlq", ShutdownTimeout: 2 * time.Second, Logger: log,
		OnCommitted: func(c inbox.Commit) {
			sig.add(fmt.Sprintf("committed-%d", c.Partition), 0)
			sig.add(fmt.Sprintf("p%d@%d", c.Partition, c.Offset), 1)
		},
	}, handle)
	require.NoError(t, err)
	wg.Go(func() {
		if err := consumer.Run(ctx); err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the consumer stops
	producer := kc.NewClient(t, kgo.DefaultProduceTopic("orders.v1"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	order := func(p int32, id, payload string) {
		ev := envelope.Event{MessageID: id, Source: "orders", Destination: "orders.v1", Key: ptr(id), EventType: "OrderPlaced",
			SchemaVersion: 1, ContentType: "application/json", Payload: []byte(payload), OccurredAt: time.Now().UTC()}
		rec := ev.Record(envelope.EncodeOptions{})
		kr := &kgo.Record{Partition: p, Key: rec.Key, Value: rec.Value}
		for _, h := range rec.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		require.NoError(t, producer.ProduceSync(ctx, kr).FirstErr())
	}
	order(0, "order-1", `{"order":1,"total":"42.00"}`)
	order(0, "order-2", `{"order":2,"total":"poison"}`)
	order(1, "order-3", `{"order":3}`)
	sig.wait(t, "p0@2", 1, 30*time.Second) // the poisoned message was dead-lettered and committed
	sig.wait(t, "p1@1", 1, 30*time.Second)
	order(1, "order-4", `{"order":4,"step":"block"}`) // partition 1 is stuck from here
	order(1, "order-5", `{"order":5}`)
	order(1, "order-6", `{"order":6}`)
	_, err = db.Pool.Exec(ctx, `INSERT INTO keiro_subscriptions (name, position) VALUES ('billing-ledger', 0)`)
	require.NoError(t, err)

	// The console, mounted as the sidecars mount it.
	con, err := console.New(console.Config{
		Outbox: &console.OutboxConfig{Pool: db.Pool, Schema: db.Schema, MaxAttempts: 1},
		Inbox: &console.InboxConfig{Pool: db.Pool, Schema: db.Schema, Consumer: consumerName, Handler: handle,
			MaxAttempts: 1, Kafka: kc.NewClient(t), Group: consumerName, DeadLetterTopics: []string{"orders.v1.dlq"}, Topics: []string{"orders.v1"}},
		Events: &console.EventsConfig{Pool: db.Pool, Schema: db.Schema},
		Auth:   console.AuthConfig{AllowUnauthenticated: true},
		Title:  "acme-billing",
		Logger: log,
	})
	require.NoError(t, err)
	h, _, err := httpserver.NewHandler(httpserver.Config{Admin: con})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	// The browser.
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-default-browser-check", true))...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(browser), "start chromium") // the first call starts the browser: no timeout on it
	bctx, cancelTimeout := context.WithTimeout(browser, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...), what)
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err, "screenshot "+name)
		require.NoError(t, os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644))
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, "read "+sel)
		return strings.TrimSpace(s)
	}
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll(`+strconv.Quote(sel)+`).length`))
		require.NoError(t, err, "count "+sel)
		return n
	}
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		require.NoError(t, err, "evaluate "+js)
		return v
	}
	scheme := func(value string) {
		t.Helper()
		_, err := chromedp.Call(bctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: value}}})
		require.NoError(t, err)
	}
	scripts := func(disabled bool) {
		t.Helper()
		_, err := chromedp.Call(bctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: disabled})
		require.NoError(t, err)
	}

	// Reads work with JavaScript disabled.
	scripts(true)
	run("overview without scripts", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#outbox-summary")))
	require.Equal(t, "1", text("#dead-count"))
	scripts(false)

	// Overview: the dead row, the backlog, the lag of the stuck partition, the failure.
	run("overview", chromedp.Navigate(srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS("#lag-table")))
	require.Equal(t, "1", text("#dead-count"))
	require.Equal(t, "1", text("#relays"))
	require.Equal(t, "3", text("#total-lag"), "partition 1: committed 1, log end 4")
	lagRows := text("#lag-table tbody")
	require.Contains(t, lagRows, "orders.v1")
	require.Contains(t, text("#consumers"), "billing")
	require.Contains(t, text("#destinations"), "payments.v1")
	require.Equal(t, 1, count("#lag-table tr.lagging"))
	shot("overview")

	// A phone's width: the header wraps and keeps every link on its own dark background.
	run("overview at 390 px", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Navigate(srv.URL+"/console/"),
		chromedp.WaitVisible(chromedp.CSS("#outbox-summary")))
	outside := eval(`(function () {
		var h = document.querySelector("header.top").getBoundingClientRect(), out = [];
		document.querySelectorAll("header.top > *, header.top nav a").forEach(function (e) {
			var r = e.getBoundingClientRect();
			if (r.top < h.top - 0.5 || r.bottom > h.bottom + 0.5 || r.left < -0.5 || r.right > window.innerWidth + 0.5) {
				out.push((e.textContent || e.className).trim());
			}
		});
		return out.join(", ");
	})()`)
	require.Empty(t, outside, "header items outside the header at 390 px")
	require.Equal(t, "390", eval(`String(document.documentElement.clientWidth)`))
	shot("overview-390")
	run("back to desktop width", chromedp.EmulateViewport(1280, 900))

	// The dark theme follows the browser's setting.
	scheme("dark")
	run("overview dark", chromedp.Navigate(srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS("#outbox-summary")))
	require.Equal(t, "rgb(15, 20, 27)", eval(`getComputedStyle(document.body).backgroundColor`))
	require.Equal(t, "rgb(23, 30, 40)", eval(`getComputedStyle(document.querySelector(".panel")).backgroundColor`))
	shot("overview-dark")
	scheme("light")
	run("overview light", chromedp.Navigate(srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS("#outbox-summary")))
	require.Equal(t, "rgb(246, 247, 249)", eval(`getComputedStyle(document.body).backgroundColor`))

	// Find a message from the header's box: by key in the outbox, by message id in the inbox.
	run("search by key", chromedp.SendKeys(chromedp.CSS("header form.search input"), "customer-7"),
		chromedp.Submit(chromedp.CSS("header form.search input")), chromedp.WaitVisible(chromedp.CSS("#search-outbox-rows")))
	found := text("#search-outbox-rows tbody")
	require.Contains(t, found, "PaymentCaptured")
	require.Contains(t, found, "pay-1042")
	require.Contains(t, found, "key", "the field that matched")
	shot("search")
	run("search by message id", chromedp.Navigate(srv.URL+"/console/search?q=order-2"), chromedp.WaitVisible(chromedp.CSS("#search-inbox-rows")))
	require.Contains(t, text("#search-inbox-rows tbody"), "poisoned")

	// The dead row, its detail with every header and the payload as text.
	run("outbox list", chromedp.Navigate(srv.URL+"/console/outbox"), chromedp.WaitVisible(chromedp.CSS("#outbox-rows")))
	rows := text("#outbox-rows tbody")
	require.Contains(t, rows, "payments.v1")
	require.Contains(t, rows, "UNKNOWN_SERVER_ERROR")
	shot("outbox")
	// The list refreshes in place (the script sets data-refreshed when it swapped the list in).
	run("list refreshed in place", chromedp.WaitReady(chromedp.CSS("body[data-refreshed]")), chromedp.WaitVisible(chromedp.CSS("#outbox-rows")))
	require.Contains(t, text("#outbox-rows tbody"), "payments.v1")
	run("open row", chromedp.Click(chromedp.CSS("#outbox-rows tbody a")), chromedp.WaitVisible(chromedp.CSS("#payload")))
	require.Equal(t, "dead", text("#row-status"))
	require.Contains(t, text("#headers"), "keiro-correlation-id")
	require.Contains(t, text("#payload"), `"note": "<script>alert('x')</script>"`, "the payload renders as indented JSON text")
	require.Zero(t, count("script:not([src])"), "the payload's <script> is text, not an element")
	require.Contains(t, text("#attempt-history"), "UNKNOWN_SERVER_ERROR", "the relay recorded the failed attempt")
	shot("outbox-row")

	// Requeue with confirmation; the relay publishes the row once the broker is fixed.
	brokerFixed.Store(true)
	run("requeue", chromedp.Click(chromedp.CSS("#requeue-one")), chromedp.WaitVisible(chromedp.CSS("#requeue-confirm")))
	require.Contains(t, text("#requeue-confirm"), "AFTER later events of its key")
	affected := text("#requeue-rows tbody")
	require.Contains(t, affected, "PaymentCaptured", "the confirmation shows what is requeued, not a bare id")
	require.Contains(t, affected, "customer-7")
	require.Contains(t, affected, "UNKNOWN_SERVER_ERROR")
	require.Contains(t, affected, "1 of 1", "attempts against the relay's ceiling")
	shot("requeue-confirm")
	run("confirm requeue", chromedp.Click(chromedp.CSS("#confirm-requeue")), chromedp.WaitVisible(chromedp.CSS("#requeue-result")))
	require.Contains(t, text("#requeue-result"), "Requeued 1 row(s).")
	loc := eval(`location.pathname`)
	require.Equal(t, "/console/outbox/requeued", loc, "the action answered 303 to its result page")
	sig.wait(t, "published", 4, 30*time.Second)
	run("row after requeue", chromedp.Click(chromedp.CSS("#requeue-result a")), chromedp.WaitVisible(chromedp.CSS("#row-status")))
	require.Equal(t, "sent", text("#row-status"))
	shot("outbox-row-sent")
	require.Contains(t, logs.String(), "console: outbox requeue")

	// The poisoned message: detail, then retry with confirmation once the handler is fixed.
	run("inbox list", chromedp.Navigate(srv.URL+"/console/inbox"), chromedp.WaitVisible(chromedp.CSS("#inbox-rows")))
	require.Contains(t, text("#inbox-rows tbody"), "poisoned")
	require.Contains(t, text("#inbox-rows tbody"), "no billing address")
	shot("inbox")
	run("open entry", chromedp.Click(chromedp.CSS("#inbox-rows tbody a")), chromedp.WaitVisible(chromedp.CSS("#payload")))
	require.Equal(t, "poisoned", text("#entry-status"))
	require.Contains(t, text("#attempt-history"), "1 of 1")
	shot("inbox-entry")

	// The failure groups and the dead-letter topic show the same message from two sides.
	run("inbox groups", chromedp.Navigate(srv.URL+"/console/inbox/groups"), chromedp.WaitVisible(chromedp.CSS("#groups")))
	require.Contains(t, text("#groups tbody"), "customer <n> has no billing address")
	shot("inbox-groups")
	run("dead letters", chromedp.Navigate(srv.URL+"/console/dead-letters"), chromedp.WaitVisible(chromedp.CSS("#dlq-rows")))
	dlq := text("#dlq-rows tbody")
	require.Contains(t, dlq, "permanent")
	require.Contains(t, dlq, "no billing address")
	require.Contains(t, dlq, "orders.v1/0@1")
	shot("dead-letters")
	run("back to list", chromedp.Navigate(srv.URL+"/console/inbox"), chromedp.WaitVisible(chromedp.CSS("#inbox-rows")))
	handlerFixed.Store(true)
	run("select and retry", chromedp.Click(chromedp.CSS(".select-all")), chromedp.Click(chromedp.CSS("#retry-selected")),
		chromedp.WaitVisible(chromedp.CSS("#retry-confirm")))
	require.Contains(t, text("#retry-confirm"), "orders / order-2")
	run("confirm retry", chromedp.Click(chromedp.CSS("#confirm-retry")), chromedp.WaitVisible(chromedp.CSS("#retry-result")))
	require.Contains(t, text("#retry-result"), "1 of 1 message(s) processed.")
	require.Contains(t, text("#retry-result"), "processed")
	shot("retry-result")
	run("empty inbox", chromedp.Navigate(srv.URL+"/console/inbox"), chromedp.WaitVisible(chromedp.CSS("#no-rows")))

	run("subscriptions", chromedp.Navigate(srv.URL+"/console/subscriptions"), chromedp.WaitVisible(chromedp.CSS("#subscriptions")))
	require.Contains(t, text("#subscriptions"), "billing-ledger")
	shot("subscriptions")

	// The docs show these screenshots: KEIRO_UPDATE_DOCS=1 refreshes them.
	if os.Getenv("KEIRO_UPDATE_DOCS") != "" {
		docs := filepath.Join("..", "..", "docs", "console")
		require.NoError(t, os.MkdirAll(docs, 0o755))
		for _, name := range []string{"overview", "overview-390", "overview-dark", "search", "outbox", "outbox-row", "requeue-confirm", "inbox", "retry-result", "inbox-groups", "dead-letters"} {
			b, err := os.ReadFile(filepath.Join(shots, name+".png"))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(docs, name+".png"), b, 0o644))
		}
	}
	t.Logf("screenshots in %s", shots)
}
