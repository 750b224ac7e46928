package testenv_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

func TestProgressWaitsForReports(t *testing.T) {
	t.Parallel()
	var p testenv.Progress
	changed := p.Changed()
	go func() {
		for range 3 {
			p.Add(1)
		}
	}()
	<-changed
	p.Wait(t, 3, time.Minute, nil)
	if got := p.Value(); got != 3 {
		t.Fatalf("Value = %d, want 3", got)
	}
	p.Set(0)
	if got := p.Value(); got != 0 {
		t.Fatalf("Value after Set(0) = %d", got)
	}
}

func TestProgressWaitFailures(t *testing.T) {
	t.Parallel()
	var p testenv.Progress
	stop := make(chan error, 1)
	stop <- errors.New("broken pipe")
	if msg := record(t, func(tb testing.TB) { p.Wait(tb, 1, time.Minute, stop) }); !strings.Contains(msg, "stopped at 0 of 1: broken pipe") {
		t.Fatalf("stop: %q", msg)
	}
	if msg := record(t, func(tb testing.TB) { p.Wait(tb, 1, time.Millisecond, nil) }); !strings.Contains(msg, "timed out after 1ms at 0 of 1") {
		t.Fatalf("timeout: %q", msg)
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	n := 0
	testenv.WaitFor(t, time.Minute, "three polls", func() bool { n++; return n == 3 })
	if msg := record(t, func(tb testing.TB) {
		testenv.WaitFor(tb, time.Millisecond, "the impossible", func() bool { return false })
	}); !strings.Contains(msg, "waiting for the impossible") {
		t.Fatalf("timeout: %q", msg)
	}
}

func TestConsumeRecordsWaitsForProducedRecords(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t, "orders")
	go func() {
		for i := range 3 {
			k.Client.Produce(t.Context(), &kgo.Record{Topic: "orders", Value: []byte{byte('a' + i)}}, nil)
		}
	}()
	recs := k.ConsumeRecords(t, 3, time.Minute, "orders")
	if len(recs) != 3 {
		t.Fatalf("got %d records, want 3", len(recs))
	}
}
