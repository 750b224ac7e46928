// Command relayrss measures the peak resident set size of the built relay binary (cmd/relay)
// while it drains a pre-enqueued backlog, in claim mode and in log mode, alternating the modes.
//
// For each run it creates a fresh schema, enqueues -events events of -payload bytes over -keys
// keys with outbox.Store.EnqueueTx in transactions of 1,000 (switching the schema to log mode
// first for a log run), starts `relay run --mode=<mode>` against franz-go's kfake (in this
// process, so the broker's memory is not the relay's), reads the topic back until every event
// is there, and reports the relay's VmHWM (/proc/<pid>/status, sampled until the drain ends),
// the drain's duration and the relay's CPU time. Build the relay first:
//
//	go build -o /tmp/relay ./cmd/relay
//	cd bench && go run ./cmd/relayrss -relay /tmp/relay -runs 3
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/migrations"
	"github.com/keiro-go/keiro/outbox"
)

func main() {
	relay := flag.String("relay", "/tmp/relay", "path of the built relay binary (go build -o /tmp/relay ./cmd/relay)")
	dsn := flag.String("database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL URL")
	events := flag.Int("events", 200_000, "events enqueued before the drain")
	keys := flag.Int("keys", 10_000, "distinct keys")
	payload := flag.Int("payload", 1024, "payload bytes per event")
	runs := flag.Int("runs", 1, "runs of each mode, alternating claim, log, claim, log, …")
	modes := flag.String("modes", "claim,log", "modes to run, in this order each round")
	flag.Parse()
	ctx := context.Background()
	for r := 1; r <= *runs; r++ {
		for _, m := range strings.Split(*modes, ",") {
			res, err := runOnce(ctx, *relay, *dsn, outbox.Mode(m), *events, *keys, *payload)
			if err != nil {
				fmt.Fprintf(os.Stderr, "run %d %s: %v\n", r, m, err)
				os.Exit(1)
			}
			fmt.Printf("run %d mode=%s events=%d peak-rss=%.1f MiB drain=%.2fs rate=%.0f msgs/s relay-cpu=%.2fs load=%s\n",
				r, m, *events, float64(res.hwmKiB)/1024, res.drain.Seconds(), float64(*events)/res.drain.Seconds(),
				res.cpu.Seconds(), loadavg())
		}
	}
}

type result struct {
	hwmKiB int64
	drain  time.Duration
	cpu    time.Duration
}

func runOnce(ctx context.Context, relay, dsn string, mode outbox.Mode, n, keys, size int) (res result, err error) {
	schema := fmt.Sprintf("relayrss_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return res, err
	}
	defer conn.Close(ctx)
	if err := migrations.Migrate(ctx, conn, schema); err != nil {
		return res, fmt.Errorf("migrate: %w", err)
	}
	slot := outbox.DefaultLogSlot(schema)
	defer func() {
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		for range 100 {
			var left int
			_ = conn.QueryRow(ctx, `SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot).Scan(&left)
			var exists bool
			_ = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&exists)
			if !exists {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		_, _ = conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+slot)
		_, _ = conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	}()
	st, err := outbox.NewStore(schema)
	if err != nil {
		return res, err
	}
	if mode == outbox.ModeLog {
		admin, err := outbox.NewAdmin(schema)
		if err != nil {
			return res, err
		}
		if _, err := admin.SetMode(ctx, conn, outbox.ModeLog, ""); err != nil {
			return res, fmt.Errorf("switch to log mode: %w", err)
		}
	}
	topic := "orders"
	pad := bytes.Repeat([]byte("x"), max(0, size-16))
	for i := 0; i < n; i += 1000 {
		evs := make([]envelope.Event, 0, 1000)
		for j := i; j < min(n, i+1000); j++ {
			k := "k" + strconv.Itoa(j%keys)
			evs = append(evs, envelope.Event{MessageID: "m" + strconv.Itoa(j), Source: "ordering",
				Destination: topic, Key: &k, EventType: "E", ContentType: envelope.ContentTypeJSON,
				Payload: append([]byte(`{"i":`+strconv.Itoa(1e9+j)+`,"p":"`), append(pad, `"}`...)...)[:size], OccurredAt: time.Now().UTC()})
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := st.EnqueueTx(ctx, tx, evs...)
			return err
		}); err != nil {
			return res, fmt.Errorf("enqueue: %w", err)
		}
	}
	if _, err := conn.Exec(ctx, "ANALYZE "+schema+".keiro_outbox"); err != nil {
		return res, err
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(10, topic))
	if err != nil {
		return res, fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return res, err
	}
	defer consumer.Close()

	cmd := exec.Command(relay, "run", "--database-url", dsn, "--schema", schema, "--mode", string(mode),
		"--brokers", strings.Join(cluster.ListenAddrs(), ","), "--http-addr", "")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan int64, 1)
	go func() {
		var hwm int64
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if v := vmHWM(pid); v > hwm {
				hwm = v
			}
			select {
			case <-sampleCtx.Done():
				sampled <- hwm
				return
			case <-t.C:
			}
		}
	}()
	seen := make(map[string]struct{}, n)
	deadline := time.Now().Add(10 * time.Minute)
	for len(seen) < n {
		if time.Now().After(deadline) {
			err = fmt.Errorf("drain timed out with %d of %d records", len(seen), n)
			break
		}
		select {
		case e := <-exited:
			stopSampling()
			<-sampled
			return res, fmt.Errorf("relay exited during the drain: %v", e)
		default:
		}
		fctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := consumer.PollFetches(fctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == envelope.HeaderMessageID {
					seen[string(h.Value)] = struct{}{}
				}
			}
		})
	}
	res.drain = time.Since(t0)
	stopSampling()
	res.hwmKiB = max(<-sampled, vmHWM(pid))
	_ = cmd.Process.Signal(syscall.SIGTERM)
	// The relay stops cleanly on SIGTERM: an exit status other than 0, or a relay that had
	// to be killed, fails the run after the drain's own failure.
	var stopErr error
	select {
	case e := <-exited:
		if e != nil {
			stopErr = fmt.Errorf("relay's stop after the drain: %w", e)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		stopErr = fmt.Errorf("relay did not stop within 30 s of SIGTERM (killed: %v)", <-exited)
	}
	err = errors.Join(err, stopErr)
	if ps := cmd.ProcessState; ps != nil {
		res.cpu = ps.UserTime() + ps.SystemTime()
	}
	if err != nil {
		return res, err
	}
	if res.hwmKiB == 0 {
		return res, errors.New("no VmHWM read from the relay's /proc status")
	}
	return res, nil
}

// vmHWM returns the process's peak resident set size in KiB, 0 once it has exited.
func vmHWM(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kib
		}
	}
	return 0
}

// loadavg returns the one-minute load average.
func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(data))[0]
}
