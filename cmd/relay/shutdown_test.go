package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestShutdownReleasesInFlightRows: Kafka stops answering produce requests, rows are in flight,
// SIGTERM arrives. The relay stops waiting within --shutdown-timeout, releases the claimed rows
// back to pending without using an attempt, and exits 0.
func TestShutdownReleasesInFlightRows(t *testing.T) {
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	kc.CreateTopic(t, "orders", 1)

	produceSeen := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	kc.Cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kc.Cluster.KeepControl()
		once.Do(func() { close(produceSeen) })
		kc.Cluster.SleepControl(func() { <-release }) // the broker hangs
		return nil, nil, false
	})

	const shutdownTimeout = 4 * time.Second
	p := start(t, nil, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "--brokers="+kc.Seeds[0],
		"--http-addr=127.0.0.1:0", "--poll-interval=100ms", "--shutdown-timeout="+shutdownTimeout.String())
	base := "http://" + p.waitLine(t, listening, 30*time.Second)[1]
	p.waitLine(t, regexpMust(`relay running`), 30*time.Second)

	ctx := context.Background()
	st, err := outbox.NewStore(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	events := make([]envelope.Event, 10)
	for i := range events {
		events[i] = testEvent(fmt.Sprintf("h-%02d", i), "ordering", "orders", k("o1"))
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueTx(ctx, tx, events...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-produceSeen:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never produced")
	}
	var publishing int
	if err := db.Pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.keiro_outbox WHERE status = 'publishing'", db.Schema)).Scan(&publishing); err != nil || publishing == 0 {
		t.Fatalf("want rows in flight, got %d (%v)", publishing, err)
	}

	began := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// While it drains, /readyz says so (load balancers stop routing), /healthz and /metrics
	// still answer.
	p.waitLine(t, regexpMust(`shutting down`), 10*time.Second)
	if code, body := httpGet(t, base+"/readyz"); code != 503 || !strings.Contains(body, "draining") {
		t.Fatalf("readyz while draining: %d %s", code, body)
	}
	if code, _ := httpGet(t, base+"/healthz"); code != 200 {
		t.Fatalf("healthz while draining: %d", code)
	}
	if code, _ := httpGet(t, base+"/metrics"); code != 200 {
		t.Fatalf("metrics while draining: %d", code)
	}
	select {
	case <-p.done:
	case <-time.After(shutdownTimeout + 10*time.Second):
		t.Fatalf("still running %s after SIGTERM", time.Since(began))
	}
	took := time.Since(began)
	if p.err != nil {
		t.Fatalf("exit: %v", p.err)
	}
	if took > shutdownTimeout {
		t.Fatalf("shutdown took %s, over --shutdown-timeout=%s", took, shutdownTimeout)
	}
	t.Logf("shutdown with a hung broker took %s", took)

	if !strings.Contains(p.output(), "shutting down") {
		t.Fatalf("no shutdown log:\n%s", p.output())
	}
	// The rows in flight are released to pending without using an attempt (the database is up,
	// so the release is written). Had it not been, they would stay publishing under their lease
	// and be re-claimed when it ends: either way none is lost, as the second relay shows.
	counts := map[string]int{}
	rows, err := db.Pool.Query(ctx, fmt.Sprintf("SELECT status, attempt_count, count(*) FROM %s.keiro_outbox GROUP BY 1, 2", db.Schema))
	if err != nil {
		t.Fatal(err)
	}
	var status string
	var attempts, c int
	if _, err := pgx.ForEachRow(rows, []any{&status, &attempts, &c}, func() error {
		counts[fmt.Sprintf("%s/%d", status, attempts)] = c
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if counts["pending/0"] != len(events) {
		t.Fatalf("want every row released to pending with 0 attempts, got status/attempts counts %v", counts)
	}

	close(release) // the broker answers again
	p2 := start(t, nil, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "--brokers="+kc.Seeds[0],
		"--http-addr=", "--poll-interval=100ms", "--shutdown-timeout="+shutdownTimeout.String())
	p2.waitLine(t, regexpMust(`relay running`), 30*time.Second)
	want := map[string]bool{}
	for _, e := range events {
		want[e.MessageID] = true
	}
	consumeIDs(t, kc, "orders", want, 60*time.Second)
	// The records may be on Kafka from the first relay's request, which the broker completed
	// after it woke: wait for the second relay to mark every row sent. Polling, because the
	// relay is another process with no signal to wait on.
	deadline := time.Now().Add(60 * time.Second)
	for sent := 0; sent != len(events); {
		if err := db.Pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.keiro_outbox WHERE status = 'sent'", db.Schema)).Scan(&sent); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d rows sent by the second relay", sent, len(events))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p2.done
	if p2.err != nil {
		t.Fatalf("second relay exit: %v", p2.err)
	}
}

// consumeIDs reads topic from the start until every message id in want was seen (duplicates
// are allowed: delivery is at least once).
func consumeIDs(t *testing.T, kc *testenv.Kafka, topic string, want map[string]bool, timeout time.Duration) {
	t.Helper()
	cl := kc.NewClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	missing := maps.Clone(want)
	for len(missing) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("message ids never published: %v", slices.Sorted(maps.Keys(missing)))
		}
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == envelope.HeaderMessageID {
					delete(missing, string(h.Value))
				}
			}
		})
	}
}
