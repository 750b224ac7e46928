package main

import (
	"reflect"
	"testing"
	"time"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/outbox"
)

// Every run flag reaches the outbox library's configuration.
func TestRelayConfigMapping(t *testing.T) {
	g, err := parse(t, "--database-url=postgres://h/db", "--schema=tenant_b", "--brokers=k:9092",
		"--policy=stop-the-line", "--batch-size=64", "--max-in-flight=2", "--claim-concurrency=3", "--max-attempts=3",
		"--backoff-initial=250ms", "--backoff-max=30s", "--backoff-multiplier=1.5", "--lease=45s",
		"--poll-interval=500ms", "--poll-only", "--shutdown-timeout=20s", "--retention=0",
		"--maintenance-interval=1m", "--vacuum-threshold=0", "--max-record-bytes=4096", "--destinations=orders,invoices",
		"--exactly-once", "--offsets-topic=relay-offsets", "--instance-id=relay-0", "--transaction-timeout=30s",
		"--transaction-linger=5ms")
	if err != nil {
		t.Fatal(err)
	}
	cfg := g.Run.relayConfig(g.DB.Schema, g.DB.PgBouncer, nil)
	want := outbox.RelayConfig{
		Schema: "tenant_b", Policy: outbox.StopTheLine, BatchSize: 64, MaxInFlightBatches: 2, ClaimConcurrency: 3, MaxAttempts: 3,
		Backoff: keiro.Backoff{Initial: 250 * time.Millisecond, Max: 30 * time.Second, Multiplier: 1.5},
		Lease:   45 * time.Second, PollInterval: 500 * time.Millisecond, PollOnly: true,
		ShutdownTimeout: 18 * time.Second, Retention: -1, MaintenanceInterval: time.Minute, VacuumThreshold: -1,
		MaxRecordBytes: 4096, Destinations: []string{"orders", "invoices"}, Mode: outbox.ModeClaim,
		ExactlyOnce: true, OffsetsTopic: "relay-offsets", InstanceID: "relay-0", TransactionTimeout: 30 * time.Second,
		TransactionLinger: 5 * time.Millisecond,
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("relay config:\n got %+v\nwant %+v", cfg, want)
	}

	g, err = parse(t, "--database-url=postgres://h/db", "--brokers=k:9092", "--retention=72h", "--shutdown-timeout=3s")
	if err != nil {
		t.Fatal(err)
	}
	cfg = g.Run.relayConfig(g.DB.Schema, g.DB.PgBouncer, nil)
	if cfg.Retention != 72*time.Hour || cfg.Policy != outbox.PerKeyHeadOfLine || cfg.Destinations != nil {
		t.Fatalf("retention %s policy %s destinations %v", cfg.Retention, cfg.Policy, cfg.Destinations)
	}
	if cfg.ShutdownTimeout != 1500*time.Millisecond { // max(3s-2s, 3s/2)
		t.Fatalf("relay shutdown timeout for 3s: %s", cfg.ShutdownTimeout)
	}
	if cfg.VacuumThreshold != DefaultVacuumThreshold {
		t.Fatalf("vacuum threshold by default: %d", cfg.VacuumThreshold)
	}
}
