package handlers

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// outageDuration is how long TestHTTPTargetOutageUsesNoAttempt keeps the target down:
// $KEIRO_TEST_OUTAGE (a Go duration, e.g. 30s for the full scenario) or 2s.
func outageDuration(t *testing.T) time.Duration {
	if v := os.Getenv("KEIRO_TEST_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "KEIRO_TEST_OUTAGE")
		return d
	}
	return 2 * time.Second
}

// TestHTTPTargetOutageUsesNoAttempt: the target refuses connections for a while (far longer
// than MaxAttempts backoffs), then comes up answering 429 with Retry-After once and 503 once:
// an outage of the target, not of the messages. No record is dead-lettered, no attempt is
// used, the service sees every message answered 2xx exactly once, and Retry-After is honoured.
func TestHTTPTargetOutageUsesNoAttempt(t *testing.T) {
	t.Parallel()
	testHTTPTargetOutage(t, outageDuration(t))
}

func testHTTPTargetOutage(t *testing.T, down time.Duration) {
	db := testenv.NewDB(t)
	kc := testenv.NewKafka(t)
	const topic, n = "billing.outage.v1", 20
	kc.CreateTopic(t, topic, 1) // one partition: requests are sequential, so gaps are measurable
	kc.CreateTopic(t, topic+".dlq", 1)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // connection refused until the server comes up

	recs := make([]*kgo.Record, n)
	for i := range recs {
		ev := testEvent()
		ev.MessageID = fmt.Sprintf("msg-%02d", i)
		r := ev.Record(envelope.EncodeOptions{})
		hs := make([]kgo.RecordHeader, len(r.Headers))
		for j, h := range r.Headers {
			hs[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
		recs[i] = &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: hs}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, kc.NewClient(t).ProduceSync(ctx, recs...).FirstErr())

	h := newHTTP(t, "http://"+addr, func(c *HTTPConfig) { c.Timeout = 2 * time.Second })
	t.Cleanup(h.CloseIdleConnections)
	var (
		mu        sync.Mutex
		committed int64
		dead      int
	)
	allCommitted := make(chan struct{})
	c, err := inbox.NewConsumer(db.Pool, inbox.ConsumerConfig{
		Brokers: kc.Seeds, Group: "billing", Topics: []string{topic}, BatchSize: 1,
		Store:  inbox.StoreConfig{Schema: db.Schema, Consumer: "billing", MaxAttempts: 2},
		Retry:  keiro.Backoff{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger: slog.New(slog.DiscardHandler),
		KafkaOpts: []kgo.Opt{kgo.HeartbeatInterval(100 * time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
		OnCommitted: func(cm inbox.Commit) {
			mu.Lock()
			defer mu.Unlock()
			if committed < n && cm.Offset >= n {
				close(allCommitted)
			}
			committed = max(committed, cm.Offset)
		},
		OnDeadLettered: func(*kgo.Record, string) {
			mu.Lock()
			dead++
			mu.Unlock()
		},
	}, h.Handle)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	// The target's outage is the scenario itself: it stays down for down.
	time.Sleep(down)
	require.Greater(t, c.Stats().Deferred, int64(2), "the consumer kept trying the unreachable target")

	var (
		smu        sync.Mutex
		requests   int
		ok         = map[string]int{}
		answered   time.Time
		retryAfter time.Duration
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		smu.Lock()
		defer smu.Unlock()
		requests++
		switch requests {
		case 1:
			answered = time.Now()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		case 2:
			retryAfter = time.Since(answered)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		ok[r.Header.Get(HeaderIdempotencyKey)]++
	}))
	for i := 0; ; i++ {
		srv.Listener, err = net.Listen("tcp", addr)
		if err == nil || i == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond) // the port may linger for a moment
	}
	require.NoError(t, err)
	srv.Start()
	t.Cleanup(srv.Close)

	select {
	case <-allCommitted:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for every record to be committed")
	}
	mu.Lock()
	require.Zero(t, dead, "an outage of the target dead-letters nothing")
	mu.Unlock()
	st := c.Stats()
	require.Zero(t, st.HandlerFailures, "no attempt was used")
	require.EqualValues(t, n, st.Processed)
	smu.Lock()
	require.Len(t, ok, n)
	for k, v := range ok {
		require.Equal(t, 1, v, "deliveries of %s", k)
	}
	require.GreaterOrEqual(t, retryAfter, 900*time.Millisecond, "Retry-After: 1 is honoured")
	smu.Unlock()
	failed, err := c.Store().CountFailed(context.Background(), db.Pool)
	require.NoError(t, err)
	require.Zero(t, failed)
}
