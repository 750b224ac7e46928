package main

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// --compression and --max-batch-bytes reach the producer; bad values are refused by name.
func TestProducerTuningFlags(t *testing.T) {
	g, err := parse(t, "--database-url=postgres://h/db", "--brokers=k:9092", "--compression=zstd", "--max-batch-bytes=524288", "--pgbouncer")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := g.Run.kafkaOpts()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if v := cl.OptValue(kgo.ProducerBatchMaxBytes); v != int32(524288) {
		t.Fatalf("ProducerBatchMaxBytes = %v", v)
	}
	codecs, _ := cl.OptValue(kgo.ProducerBatchCompression).([]kgo.CompressionCodec)
	if len(codecs) != 1 || codecs[0] != kgo.ZstdCompression() {
		t.Fatalf("ProducerBatchCompression = %v", codecs)
	}
	if !g.Run.relayConfig(g.DB.Schema, g.DB.PgBouncer, nil).PollOnly {
		t.Fatal("--pgbouncer must imply polling only")
	}
	g, err = parse(t, "--database-url=postgres://h/db", "--brokers=k:9092", "--cloudevents", "--cloudevents-destinations=orders,invoices")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := g.Run.relayConfig(g.DB.Schema, false, nil); !cfg.CloudEvents || strings.Join(cfg.CloudEventsDestinations, ",") != "orders,invoices" {
		t.Fatalf("CloudEvents %v %v", cfg.CloudEvents, cfg.CloudEventsDestinations)
	}

	_, err = parse(t, "--database-url=postgres://h/db", "--brokers=k:9092", "--compression=brotli", "--max-batch-bytes=10", "--cloudevents-destinations=a b")
	for _, want := range []string{`--compression: unknown codec "brotli"`, `--cloudevents-destinations: topic "a b"`, "--max-batch-bytes: must be 0 (the producer's default) or at least 1024, got 10"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("missing %q in %v", want, err)
		}
	}
}
