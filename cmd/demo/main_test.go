package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestDemoRunsAndHoldsItsInvariants runs the demo with JSON payloads, with --avro on the real
// schema registry (Apicurio, as --schema-registry), and with --avro on the embedded registry a
// demo without --schema-registry starts.
func TestDemoRunsAndHoldsItsInvariants(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"json", "avro", "avro-embedded-registry"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{
				Orders: 120, Customers: 7, Producers: 3, Duplicates: 9, Avro: name != "json",
				DatabaseURL: testenv.DatabaseURL(), Schema: testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema, Timeout: time.Minute,
			}
			if name == "avro" {
				reg := testenv.NewSchemaRegistry(t)
				cfg.SchemaRegistryURL, cfg.Topic = reg.URL, reg.Name(DefaultTopic)
			}
			var out bytes.Buffer
			rep, err := Run(context.Background(), cfg, &out)
			switch name {
			case "avro":
				require.Contains(t, out.String(), "registry  "+cfg.SchemaRegistryURL+"\n")
			case "avro-embedded-registry":
				require.Contains(t, out.String(), "registry  embedded schema registry at ")
			}
			require.NoError(t, err, out.String())
			require.True(t, rep.OK(), out.String())
			s := out.String()
			require.Contains(t, s, "kcat -b 127.0.0.1:")
			require.Regexp(t, `orders placed\s+120\s+ok`, s)
			require.Regexp(t, `duplicates suppressed\s+9\s+ok`, s)
			require.Regexp(t, `effects applied \(invoices\)\s+120 \(120 distinct orders\)\s+ok`, s)
			require.Regexp(t, `per-key order verified\s+7 customers\s+ok`, s)
			require.Regexp(t, `sagas in exactly one terminal state\s+120 of 120\s+ok`, s)
			require.Regexp(t, `saga effects applied once\s+0 settlements off\s+ok`, s)
			require.Regexp(t, `payment timers fired\s+120\s+ok`, s)
			require.Regexp(t, `sagas timed out \(settlement voided\)\s+([4-9]\d|1[0-2]\d)\s`, s) // at least the 40 that never pay
			require.Regexp(t, `shipment workflows completed\s+120 of 120\s+ok`, s)
			require.Regexp(t, `shipment steps ran once \(reserve, ship\)\s+120 of 120 parcels\s+ok`, s)
			require.Regexp(t, `shipment journal entries\s+240\s+ok`, s)
			require.Contains(t, s, "all invariants hold")
		})
	}
}

// TestDemoAgainstAnExternalBroker runs the --brokers path: topics are created on the given
// broker with a per-run suffix, so earlier runs' records never reach the counts.
func TestDemoAgainstAnExternalBroker(t *testing.T) {
	t.Parallel()
	kc := testenv.NewKafka(t)
	schemaName := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema
	for run := range 2 {
		var out bytes.Buffer
		rep, err := Run(context.Background(), Config{
			Orders: 40, Customers: 5, Duplicates: 3, Brokers: kc.Seeds,
			DatabaseURL: testenv.DatabaseURL(), Schema: schemaName, Timeout: time.Minute, Quiet: true,
		}, &out)
		require.NoError(t, err, "run %d: %s", run, out.String())
		require.True(t, rep.OK(), "run %d: %s", run, out.String())
		require.Regexp(t, `effects applied \(invoices\)\s+40 \(40 distinct orders\)\s+ok`, out.String())
		require.NotContains(t, out.String(), "kcat", "quiet prints only the table")
	}
}

func TestOrderViolationsDetectsSwapsGapsAndLosses(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, billingDDL(db.Schema))
	require.NoError(t, err)
	ins := func(customer string, seqs ...int64) {
		for _, s := range seqs {
			_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Schema+`.billing_invoices (order_id, customer, customer_seq, amount, message_id) VALUES ('o', $1, $2, 1, 'm')`, customer, s)
			require.NoError(t, err)
		}
	}
	ins("good", 1, 2, 3)
	ins("swapped", 1, 3, 2)
	ins("lost", 1, 2)
	ins("twice", 1, 1, 2)
	ins("stray", 1)
	v, err := orderViolations(ctx, db.Pool, db.Schema, map[string]int64{"good": 3, "swapped": 3, "lost": 3, "twice": 2})
	require.NoError(t, err)
	joined := strings.Join(v, "\n")
	require.Len(t, v, 4, joined)
	require.Contains(t, joined, "swapped: position 2 applied seq 3")
	require.Contains(t, joined, "lost: 2 applied, 3 placed")
	require.Contains(t, joined, "twice: 3 applied, 2 placed")
	require.Contains(t, joined, "stray: 1 applied, 0 placed")
	require.NotContains(t, joined, "good")
}

func TestReportFailsOnABrokenInvariant(t *testing.T) {
	t.Parallel()
	r := &Report{Checks: []Check{{Name: "a", Value: "1", OK: true}, {Name: "b", Value: "2", OK: false}}}
	require.False(t, r.OK())
	var out bytes.Buffer
	r.Print(&out)
	require.Regexp(t, `b\s+2\s+FAILED`, out.String())
	require.NotContains(t, out.String(), "all invariants hold")
}

func TestRealMainExitCodes(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, realMain([]string{"-n", "x"}, &stdout, &stderr))
	require.Equal(t, 2, realMain([]string{"stray"}, &stdout, &stderr))
	require.Equal(t, 0, realMain([]string{"--help"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "-brokers")

	// Bad configuration is reported at once, every problem together.
	stderr.Reset()
	require.Equal(t, 1, realMain([]string{"-n", "-3", "--schema", "Bad-Name", "--schema-registry", "http://r"}, &stdout, &stderr))
	for _, want := range []string{"-n must be positive", "--schema", "--schema-registry needs --avro"} {
		require.Contains(t, stderr.String(), want)
	}

	// An unreachable database fails with a hint, exit 1.
	stderr.Reset()
	require.Equal(t, 1, realMain([]string{"--database-url", "postgres://nobody@127.0.0.1:1/x?connect_timeout=2", "-n", "3"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "set DATABASE_URL")
}

// TestDemoKeepsTheConsoleUp runs the demo with a console and --keep: the console's URL is
// printed, it answers while the demo stays up, and the demo returns when its context ends.
func TestDemoKeepsTheConsoleUp(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		rep *Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := Run(ctx, Config{
			Orders: 30, Customers: 3, Duplicates: 2, DatabaseURL: testenv.DatabaseURL(), Schema: testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true}).Schema,
			Timeout: time.Minute, ConsoleAddr: "127.0.0.1:0", Keep: true,
		}, pw)
		_ = pw.Close()
		done <- result{rep, err}
	}()
	var url string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		line := sc.Text()
		if u, ok := strings.CutPrefix(line, "console   "); ok {
			url = u
		}
		if strings.Contains(line, "press Ctrl-C to stop") {
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	require.True(t, strings.HasPrefix(url, "http://127.0.0.1:"), url)
	require.True(t, strings.HasSuffix(url, "/console/"), url)

	resp, err := http.Get(strings.TrimSuffix(url, "/console/") + "/api/v1/outbox/summary")
	require.NoError(t, err)
	var s struct {
		Totals map[string]int64 `json:"totals"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	resp.Body.Close()
	require.Equal(t, int64(30), s.Totals["sent"])
	page, err := http.Get(url)
	require.NoError(t, err)
	page.Body.Close()
	require.Equal(t, http.StatusOK, page.StatusCode)

	cancel()
	res := <-done
	require.NoError(t, res.err)
	require.True(t, res.rep.OK())
}
