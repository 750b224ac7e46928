package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/cli/dsntest"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

func parse(t *testing.T, args ...string) (*grammar, error) {
	t.Helper()
	var out strings.Builder
	a := app()
	a.Stdout, a.Stderr = &out, &out
	g := &grammar{}
	_, err := a.Parse(g, args)
	return g, err
}

func TestDefaults(t *testing.T) {
	g, err := parse(t, "--database-url=postgres://h/db", "--brokers=k:9092")
	if err != nil {
		t.Fatal(err)
	}
	r := g.Run
	want := runCmd{
		Policy: DefaultPolicy, BatchSize: DefaultBatchSize, MaxInFlight: DefaultMaxInFlight, ClaimConcurrency: DefaultClaimConcurrency,
		MaxAttempts: DefaultMaxAttempts, BackoffInitial: DefaultBackoffInitial, BackoffMax: DefaultBackoffMax,
		BackoffMultiplier: DefaultBackoffMultiplier,
		Lease:             DefaultLease, PollInterval: DefaultPollInterval, ShutdownTimeout: DefaultShutdownTimeout,
		Retention: DefaultRetention, MaintenanceInterval: DefaultMaintenanceInterval, HTTPAddr: DefaultHTTPAddr,
		VacuumThreshold: DefaultVacuumThreshold, Mode: "claim",
		OffsetsTopic: outbox.DefaultOffsetsTopic, TransactionTimeout: outbox.DefaultTransactionTimeout,
		TransactionLinger: outbox.DefaultTransactionLinger,
	}
	if r.Kafka.ClientID != DefaultClientID {
		t.Fatalf("client id %q", r.Kafka.ClientID)
	}
	r.Kafka = want.Kafka
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", r, want)
	}
	if g.DB.Schema != "keiro" || g.LogLevel != "info" || g.LogFormat != "text" {
		t.Fatalf("globals: %+v %+v", g.DB, g.LogFlags)
	}
	if p, err := outbox.ParsePolicy(DefaultPolicy); err != nil || p != outbox.PerKeyHeadOfLine {
		t.Fatalf("DefaultPolicy %q is not per-key head-of-line: %v", DefaultPolicy, err)
	}
}

// The environment variables docker-compose.yml uses, and flag-over-env precedence.
func TestEnvAndPrecedence(t *testing.T) {
	t.Setenv("KEIRO_RELAY_DATABASE_URL", "postgres://u:pw@db/app")
	t.Setenv("KEIRO_RELAY_BROKERS", "k1:9092,k2:9092")
	t.Setenv("KEIRO_RELAY_SCHEMA", "tenant_a")
	t.Setenv("KEIRO_RELAY_HTTP_ADDR", "0.0.0.0:9000")
	t.Setenv("KEIRO_RELAY_MIGRATE", "true")
	t.Setenv("KEIRO_RELAY_BATCH_SIZE", "500")
	t.Setenv("KEIRO_RELAY_LEASE", "1m")
	t.Setenv("KEIRO_RELAY_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
	t.Setenv("KEIRO_RELAY_KAFKA_SASL_USERNAME", "relay")
	t.Setenv("KEIRO_RELAY_KAFKA_SASL_PASSWORD", "pw2")
	g, err := parse(t, "--batch-size=7")
	if err != nil {
		t.Fatal(err)
	}
	r := g.Run
	if g.DB.DatabaseURL.Reveal() != "postgres://u:pw@db/app" || g.DB.Schema != "tenant_a" ||
		!reflect.DeepEqual(r.Kafka.Brokers, []string{"k1:9092", "k2:9092"}) || r.HTTPAddr != "0.0.0.0:9000" ||
		!r.Migrate || r.Lease != time.Minute || r.Kafka.SASL.Password.Reveal() != "pw2" {
		t.Fatalf("env not applied: %+v %+v", g.DB, r)
	}
	if r.BatchSize != 7 {
		t.Fatalf("flag must win over KEIRO_RELAY_BATCH_SIZE: %d", r.BatchSize)
	}
	// An empty KEIRO_RELAY_HTTP_ADDR disables the server.
	t.Setenv("KEIRO_RELAY_HTTP_ADDR", "")
	g, err = parse(t)
	if err != nil || g.Run.HTTPAddr != "" {
		t.Fatalf("empty http addr: %q %v", g.Run.HTTPAddr, err)
	}
}

func TestEveryProblemNamedAtOnce(t *testing.T) {
	t.Setenv("KEIRO_RELAY_MAX_ATTEMPTS", "many")
	_, err := parse(t,
		"--schema=Bad-Schema", "--policy=random", "--batch-size=0", "--max-in-flight=-1", "--claim-concurrency=0",
		"--backoff-initial=10s", "--backoff-max=1s", "--lease=soon", "--backoff-multiplier=0.5", "--poll-interval=0s",
		"--retention=-1h", "--vacuum-threshold=-5", "--http-addr=nowhere", "--log-format=xml", "--destinations=orders, payments",
		"--kafka-sasl-mechanism=GSSAPI", "--kafka-tls-ca-file=/nonexistent")
	if err == nil {
		t.Fatal("expected errors")
	}
	msg := err.Error()
	for _, flag := range []string{
		"--database-url:", "--schema:", "--policy:", "--batch-size:", "--max-in-flight:", "--claim-concurrency:",
		"--max-attempts:", `KEIRO_RELAY_MAX_ATTEMPTS="many"`, "--backoff-multiplier:", "--backoff-max:", "--lease:", "--poll-interval:",
		"--retention:", "--vacuum-threshold:", "--http-addr:", "--log-format:", `--destinations: topic " payments"`, "--brokers:", "--kafka-sasl-mechanism:",
		"--kafka-sasl-username:", "--kafka-tls-ca-file:",
	} {
		if !strings.Contains(msg, flag) {
			t.Errorf("problem with %s not reported:\n%s", flag, msg)
		}
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) < 16 {
		t.Errorf("want every problem as its own error, got:\n%s", msg)
	}
}

// Operator commands do not need Kafka: --brokers is a run flag only.
func TestAdminCommandsNeedNoBrokers(t *testing.T) {
	for _, args := range [][]string{
		{"status"}, {"migrate"}, {"dead", "list"}, {"dead", "requeue", "--all", "--yes"},
	} {
		if _, err := parse(t, append([]string{"--database-url=postgres://h/db"}, args...)...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

func TestRequeueSelection(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"nothing":      {[]string{"dead", "requeue"}, "--all: say which rows"},
		"all, no yes":  {[]string{"dead", "requeue", "--all"}, "--yes: --all requeues every dead row"},
		"two modes":    {[]string{"dead", "requeue", "--all", "--yes", "--source=s"}, "choose one of"},
		"bad id":       {[]string{"dead", "requeue", "not-a-uuid"}, `--id: "not-a-uuid" is not a UUID`},
		"bad limit":    {[]string{"dead", "list", "--limit=0"}, "--limit: must be at least 1"},
		"unknown flag": {[]string{"dead", "list", "--frobnicate"}, "unknown flag --frobnicate"},
	}
	for name, c := range cases {
		_, err := parse(t, append([]string{"--database-url=postgres://h/db"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want %q, got %v", name, c.want, err)
		}
	}
}

// --help lists every flag with its environment variable and default, and never a secret.
func TestHelp(t *testing.T) {
	t.Setenv("KEIRO_RELAY_DATABASE_URL", "postgres://u:envsecret@db/app")
	t.Setenv("KEIRO_RELAY_KAFKA_SASL_PASSWORD", "saslsecret")
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {"dead", "requeue", "--help"}, {"status", "--help"}} {
		r := invoke(t, args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
		}
		h := strings.Join(strings.Fields(r.stdout), " ")
		if strings.Contains(h, "envsecret") || strings.Contains(h, "saslsecret") {
			t.Fatalf("%v: help prints a secret:\n%s", args, r.stdout)
		}
		for _, f := range []string{"--database-url", "$KEIRO_RELAY_DATABASE_URL", "--schema", "default: keiro", "--log-level", "--log-format"} {
			if !strings.Contains(h, f) {
				t.Errorf("%v: help lacks %q", args, f)
			}
		}
	}
	r := invoke(t, "run", "--help")
	h := strings.Join(strings.Fields(r.stdout), " ")
	flags := []struct{ flag, def string }{
		{"brokers", ""}, {"client-id", "keiro-relay"}, {"kafka-tls-enabled", ""}, {"kafka-tls-ca-file", ""},
		{"kafka-tls-cert-file", ""}, {"kafka-tls-key-file", ""}, {"kafka-tls-insecure-skip-verify", ""},
		{"kafka-tls-server-name", ""}, {"kafka-sasl-mechanism", ""}, {"kafka-sasl-username", ""},
		{"kafka-sasl-password", ""}, {"policy", "per-key"}, {"batch-size", "512"}, {"max-in-flight", "4"}, {"claim-concurrency", "1"},
		{"max-attempts", "10"}, {"backoff-initial", "1s"}, {"backoff-max", "5m0s"}, {"lease", "1m0s"},
		{"poll-interval", "1s"}, {"poll-only", ""}, {"shutdown-timeout", "10s"}, {"retention", "24h0m0s"},
		{"maintenance-interval", "30s"}, {"vacuum-threshold", "100000"}, {"backoff-multiplier", "2"}, {"max-record-bytes", ""}, {"destinations", ""}, {"migrate", ""}, {"http-addr", "127.0.0.1:9464"},
	}
	for _, f := range flags {
		env := "$KEIRO_RELAY_" + strings.ToUpper(strings.ReplaceAll(f.flag, "-", "_"))
		if !strings.Contains(h, "--"+f.flag) || !strings.Contains(h, env) {
			t.Errorf("run help lacks --%s or %s", f.flag, env)
		}
		if f.def != "" && !strings.Contains(h, "default: "+f.def) {
			t.Errorf("run help lacks default %s of --%s", f.def, f.flag)
		}
	}
}

func TestSecretsNotPrintedOnError(t *testing.T) {
	r := invoke(t, "--database-url=postgres://u:dbsecret@127.0.0.1:1/x?connect_timeout=1", "status")
	if r.code == 0 {
		t.Fatal("status against a closed port must fail")
	}
	if strings.Contains(r.stderr+r.stdout, "dbsecret") {
		t.Fatalf("password printed:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, "u:"+cli.Redacted+"@127.0.0.1:1") {
		t.Fatalf("error should name the redacted URL:\n%s", r.stderr)
	}
}

// `relay schema …` reaches cmd/internal/schemacli without the relay's database flags, and its
// problems come back with its exit code.
func TestSchemaSubcommand(t *testing.T) {
	r := invoke(t, "schema", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "register") || !strings.Contains(r.stdout, "--registry-url") {
		t.Fatalf("schema --help: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = invoke(t, "schema", "check", "orders-value", "/nonexistent.avsc")
	if r.code != 2 || !strings.Contains(r.stderr, "--registry-url") || strings.Contains(r.stderr, "--database-url") {
		t.Fatalf("schema check without registry: %d\n%s", r.code, r.stderr)
	}
	r = invoke(t, "--help")
	if !strings.Contains(r.stdout, "schema") {
		t.Fatalf("relay --help does not list schema:\n%s", r.stdout)
	}
	r = invoke(t, "--database-url=postgres://h/db", "schema", "check", "s", "/nonexistent.avsc")
	if r.code != 2 || !strings.Contains(r.stderr, "--registry-url") {
		t.Fatalf("schema after relay flags: %d\n%s", r.code, r.stderr)
	}
}

// TestSchemaRegisterAgainstTheRegistry: `relay schema register` and `check` on the real schema
// registry (Apicurio).
func TestSchemaRegisterAgainstTheRegistry(t *testing.T) {
	reg := testenv.NewSchemaRegistry(t)
	subject := reg.Name("orders-value")
	file := filepath.Join(t.TempDir(), "order.avsc")
	avsc := `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"}]}`
	if err := os.WriteFile(file, []byte(avsc), 0o600); err != nil {
		t.Fatal(err)
	}
	r := invoke(t, "schema", "register", subject, file, "--registry-url="+reg.URL)
	if r.code != 0 || !strings.Contains(r.stdout, "order.avsc in subject "+subject) {
		t.Fatalf("register: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = invoke(t, "schema", "check", subject, file, "--registry-url="+reg.URL)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "compatible") {
		t.Fatalf("check: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// --ordered-sources declares per-source order, which only the per-source policy publishes; its
// names are separated by commas alone.
func TestOrderedSourcesNeedThePerSourcePolicy(t *testing.T) {
	_, err := parse(t, "--database-url=postgres://h/db", "--brokers=h:1", "run", "--ordered-sources=ledger")
	if err == nil || !strings.Contains(err.Error(), "--ordered-sources: declares per-source order, which only --policy=per-source publishes") {
		t.Fatalf("err = %v", err)
	}
	_, err = parse(t, "--database-url=postgres://h/db", "--brokers=h:1", "run", "--policy=per-source", "--ordered-sources=ledger, audit")
	if err == nil || !strings.Contains(err.Error(), `--ordered-sources: source " audit" is empty or has spaces`) {
		t.Fatalf("err = %v", err)
	}
	g, err := parse(t, "--database-url=postgres://h/db", "--brokers=h:1", "run", "--policy=per-source", "--ordered-sources=ledger,audit")
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Run.OrderedSources; len(got) != 2 || got[0] != "ledger" || got[1] != "audit" {
		t.Fatalf("OrderedSources = %q", got)
	}
}

func TestModeFlags(t *testing.T) {
	t.Setenv("KEIRO_RELAY_MODE", "log")
	g, err := parse(t, "--database-url=postgres://h/db", "--brokers=h:1", "run", "--log-slot=orders_log")
	if err != nil {
		t.Fatal(err)
	}
	cfg := g.Run.relayConfig(g.DB.Schema, false, nil)
	if cfg.Mode != outbox.ModeLog || cfg.LogSlot != "orders_log" {
		t.Fatalf("KEIRO_RELAY_MODE=log: Mode %q, LogSlot %q", cfg.Mode, cfg.LogSlot)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--mode=wal"}, `--mode: unknown mode "wal": use claim or log`},
		{[]string{"run", "--mode=log", "--destinations=orders,a/b"}, `--destinations: entry 2 "a/b" is not a legal Kafka topic`},
		{[]string{"run", "--mode=claim", "--log-slot=s"}, "--log-slot: names the slot of --mode=log (got --mode=claim)"},
		{[]string{"run", "--mode=log", "--log-slot=Bad-Slot"}, `--log-slot: "Bad-Slot" must be 1 to 63 lower case letters`},
	} {
		_, err := parse(t, append([]string{"--database-url=postgres://h/db", "--brokers=h:1"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
	// Per-destination relays in log mode: a slot of their own, named after the set.
	g, err = parse(t, "--database-url=postgres://h/db", "--brokers=h:1", "run", "--mode=log", "--destinations=payments,orders")
	if err != nil {
		t.Fatal(err)
	}
	cfg = g.Run.relayConfig(g.DB.Schema, false, nil)
	if cfg.Mode != outbox.ModeLog || !slices.Equal(cfg.Destinations, []string{"payments", "orders"}) {
		t.Fatalf("--mode=log --destinations: Mode %q, Destinations %q", cfg.Mode, cfg.Destinations)
	}
	var out strings.Builder
	if code := run(context.Background(), []string{"--database-url=postgres://127.0.0.1:1/db", "mode", "set", "claim", "--destinations=orders"}, &out, &out); code != 2 ||
		!strings.Contains(out.String(), "--destinations names the slot of log mode") {
		t.Errorf("mode set claim --destinations: exit %d: %s", code, out.String())
	}
	if _, err := parse(t, "--database-url=postgres://h/db", "mode", "set", "wal"); err == nil || !strings.Contains(err.Error(), "must be one of") {
		t.Errorf("mode set wal: err = %v", err)
	}
}

func TestModeLogRefusesPgBouncer(t *testing.T) {
	var out strings.Builder
	code := run(context.Background(), []string{"--database-url=postgres://127.0.0.1:1/db", "--pgbouncer", "--brokers=127.0.0.1:1", "run", "--mode=log", "--http-addr="}, &out, &out)
	if code == 0 || !strings.Contains(out.String(), "--mode=log needs a direct connection") {
		t.Fatalf("exit %d: %s", code, out.String())
	}
}

// The six listing commands share --limit and --json (ListFlags): each defaults to 100 rows,
// takes $KEIRO_RELAY_LIMIT, and refuses a limit below 1 once, naming the flag, beside its own
// problems.
func TestListingCommandsShareLimitAndJSON(t *testing.T) {
	listings := [][]string{
		{"dead", "list"}, {"rows", "list"}, {"rows", "stuck"},
		{"events", "dead", "list"}, {"events", "dispatch", "list"}, {"events", "timers", "stuck"},
	}
	for _, args := range listings {
		_, err := parse(t, append(append([]string{"--database-url=postgres://h/db"}, args...), "--limit=0")...)
		if err == nil || strings.Count(err.Error(), "--limit: must be at least 1, got 0") != 1 {
			t.Errorf("%v --limit=0: want one limit problem, got %v", args, err)
		}
		r := invoke(t, append(args, "--help")...)
		h := strings.Join(strings.Fields(r.stdout), " ")
		for _, want := range []string{"--limit=", "Most rows listed", "$KEIRO_RELAY_LIMIT", "default: 100", "--json", "Print JSON lines instead of a table", "$KEIRO_RELAY_JSON"} {
			if r.code != 0 || !strings.Contains(h, want) {
				t.Errorf("%v --help lacks %q: %d\n%s", args, want, r.code, r.stdout)
			}
		}
	}
	_, err := parse(t, "--database-url=postgres://h/db", "rows", "stuck", "--limit=0", "--older-than=-1s")
	if err == nil || !strings.Contains(err.Error(), "--limit: must be at least 1") || !strings.Contains(err.Error(), "--older-than: must not be negative") {
		t.Errorf("rows stuck: want both problems, got %v", err)
	}
	t.Setenv("KEIRO_RELAY_LIMIT", "0")
	_, err = parse(t, "--database-url=postgres://h/db", "events", "dispatch", "list")
	if err == nil || !strings.Contains(err.Error(), "(from $KEIRO_RELAY_LIMIT)") {
		t.Errorf("limit from the environment: %v", err)
	}
}

// Property: a connection string with a random secret in any place and form (generated, valid or
// broken) never shows it in what the relay prints when it cannot parse or reach the database.
func TestGeneratedDSNSecretsNotPrinted(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	for range 150 {
		c := dsntest.Gen(r)
		res := invoke(t, "--database-url="+c.DSN, "status")
		if res.code == 0 {
			t.Fatalf("status with %q succeeded", c.DSN)
		}
		for _, f := range c.Forbidden {
			if strings.Contains(res.stdout+res.stderr, f) {
				t.Fatalf("the secret %q (as %q) of\n%q\nwas printed:\n%s", c.Secret, f, c.DSN, res.stderr)
			}
		}
	}
}
