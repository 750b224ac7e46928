package cli_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

type group struct {
	Mechanism string     `help:"SASL mechanism." default:"PLAIN"`
	Password  cli.Secret `help:"SASL password." default:"hunter2"`
}

func (g *group) ValidateFlags() error {
	var p cli.Problems
	if g.Mechanism != "PLAIN" && g.Mechanism != "SCRAM" {
		p.Add("mechanism", "unknown mechanism %q", g.Mechanism)
	}
	return p.Err()
}

type testGrammar struct {
	cli.LogFlags `embed:""`
	Group        group    `embed:""`
	DatabaseURL  cli.DSN  `help:"Database URL." default:"postgres://u:topsecret@h/db"`
	Run          runCmd   `cmd:"" default:"withargs" help:"Run."`
	Other        otherCmd `cmd:"" help:"Other."`
}

type runCmd struct {
	BatchSize int           `help:"Batch size." default:"32"`
	Lease     time.Duration `help:"Lease." default:"30s"`
	Migrate   bool          `help:"Migrate first."`
	ran       bool
}

func (c *runCmd) ValidateFlags() error {
	var p cli.Problems
	if c.BatchSize < 1 {
		p.Add("batch-size", "must be at least 1, got %d", c.BatchSize)
	}
	if c.Lease <= 0 {
		p.Add("lease", "must be positive")
	}
	return p.Err()
}

func (c *runCmd) Run(ctx context.Context, env *cli.Env) error {
	c.ran = true
	if ctx == nil {
		return errors.New("no context")
	}
	fmt.Fprintf(env.Stdout, "batch=%d lease=%s migrate=%v\n", c.BatchSize, c.Lease, c.Migrate)
	return nil
}

type otherCmd struct {
	Limit int `help:"Limit." default:"5"`
	Fail  bool
}

func (c *otherCmd) ValidateFlags() error {
	var p cli.Problems
	if c.Limit > 100 {
		p.Add("limit", "at most 100")
	}
	return p.Err()
}

func (c *otherCmd) Run(ctx context.Context, env *cli.Env) error {
	if c.Fail {
		return &cli.ExitError{Code: 7, Err: errors.New("boom")}
	}
	return nil
}

func app(out *bytes.Buffer) cli.App {
	return cli.App{Name: "t", EnvPrefix: "KEIRO_T", Stdout: out, Stderr: out}
}

func TestEnvAndFlagPrecedence(t *testing.T) {
	var out bytes.Buffer
	g := &testGrammar{}
	if _, err := app(&out).Parse(g, nil); err != nil {
		t.Fatal(err)
	}
	if g.Run.BatchSize != 32 || g.Run.Lease != 30*time.Second || g.LogLevel != "info" {
		t.Fatalf("defaults not applied: %+v", g.Run)
	}

	t.Setenv("KEIRO_T_BATCH_SIZE", "64")
	t.Setenv("KEIRO_T_LOG_LEVEL", "debug")
	t.Setenv("KEIRO_T_MIGRATE", "true")
	g = &testGrammar{}
	if _, err := app(&out).Parse(g, nil); err != nil {
		t.Fatal(err)
	}
	if g.Run.BatchSize != 64 || g.LogLevel != "debug" || !g.Run.Migrate {
		t.Fatalf("env not applied: batch=%d level=%s migrate=%v", g.Run.BatchSize, g.LogLevel, g.Run.Migrate)
	}

	g = &testGrammar{}
	if _, err := app(&out).Parse(g, []string{"run", "--batch-size=8", "--log-level=warn"}); err != nil {
		t.Fatal(err)
	}
	if g.Run.BatchSize != 8 || g.LogLevel != "warn" {
		t.Fatalf("flag must win over env: batch=%d level=%s", g.Run.BatchSize, g.LogLevel)
	}
}

func TestFlagWinsOverBadEnv(t *testing.T) {
	t.Setenv("KEIRO_T_BATCH_SIZE", "lots")
	var out bytes.Buffer
	g := &testGrammar{}
	if _, err := app(&out).Parse(g, []string{"--batch-size=3"}); err != nil {
		t.Fatalf("a good flag must override a bad env value: %v", err)
	}
	if g.Run.BatchSize != 3 {
		t.Fatalf("batch=%d", g.Run.BatchSize)
	}
	_, err := app(&out).Parse(&testGrammar{}, nil)
	if err == nil || !strings.Contains(err.Error(), `KEIRO_T_BATCH_SIZE="lots"`) {
		t.Fatalf("bad env value must be named with its variable, got %v", err)
	}
}

func TestEveryProblemAtOnce(t *testing.T) {
	t.Setenv("KEIRO_T_LEASE", "forever")
	t.Setenv("KEIRO_T_MECHANISM", "GSSAPI")
	var out bytes.Buffer
	_, err := app(&out).Parse(&testGrammar{}, []string{"--batch-size=abc", "--log-format=xml", "--log-level=loud"})
	if err == nil {
		t.Fatal("expected errors")
	}
	msg := err.Error()
	for _, want := range []string{"--batch-size:", "--lease:", `KEIRO_T_LEASE="forever"`, "--log-format:", "--log-level:", "--mechanism:"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	// A value that did not parse is reported once, not again as "must be at least 1".
	if strings.Contains(msg, "must be at least 1") || strings.Contains(msg, "must be positive") {
		t.Errorf("value errors reported twice:\n%s", msg)
	}
	if n := strings.Count(msg, "\n") + 1; n != 5 {
		t.Errorf("want 5 problems, got %d:\n%s", n, msg)
	}
}

func TestOnlySelectedCommandIsValidated(t *testing.T) {
	t.Setenv("KEIRO_T_LIMIT", "1000")
	var out bytes.Buffer
	if _, err := app(&out).Parse(&testGrammar{}, []string{"run"}); err != nil {
		t.Fatalf("other's flags must not fail run: %v", err)
	}
	_, err := app(&out).Parse(&testGrammar{}, []string{"other"})
	if err == nil || !strings.Contains(err.Error(), "--limit: at most 100") {
		t.Fatalf("want --limit problem, got %v", err)
	}
}

func TestHelpListsEveryFlagWithEnvAndDefaultAndNoSecret(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"run", "--help"}} {
		var out bytes.Buffer
		_, err := app(&out).Parse(&testGrammar{}, args)
		if !errors.Is(err, cli.ErrHelp) {
			t.Fatalf("%v: want ErrHelp, got %v", args, err)
		}
		h := strings.Join(strings.Fields(out.String()), " ")
		for _, want := range []string{
			"--log-level", "$KEIRO_T_LOG_LEVEL", "default: info",
			"--database-url", "$KEIRO_T_DATABASE_URL", "default: postgres://u:******@h/db",
			"--password", "$KEIRO_T_PASSWORD", "default: ******",
		} {
			if !strings.Contains(h, want) {
				t.Errorf("%v: help lacks %q:\n%s", args, want, h)
			}
		}
		if strings.Contains(h, "topsecret") || strings.Contains(h, "hunter2") {
			t.Errorf("%v: help prints a secret:\n%s", args, h)
		}
		if args[0] == "run" {
			for _, want := range []string{"--batch-size", "$KEIRO_T_BATCH_SIZE", "default: 32", "--lease", "default: 30s"} {
				if !strings.Contains(h, want) {
					t.Errorf("run help lacks %q:\n%s", want, h)
				}
			}
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	var out bytes.Buffer
	ctx := context.Background()
	if code := app(&out).Run(ctx, &testGrammar{}, []string{"--batch-size=2"}); code != 0 {
		t.Fatalf("run: exit %d: %s", code, out.String())
	}
	if !strings.Contains(out.String(), "batch=2 lease=30s") {
		t.Fatalf("default command did not run: %q", out.String())
	}
	out.Reset()
	if code := app(&out).Run(ctx, &testGrammar{}, []string{"--batch-size=0"}); code != cli.ExitUsage {
		t.Fatalf("bad config: exit %d", code)
	}
	if !strings.Contains(out.String(), "t: error: --batch-size: must be at least 1") {
		t.Fatalf("bad config output: %q", out.String())
	}
	out.Reset()
	if code := app(&out).Run(ctx, &testGrammar{}, []string{"other", "--fail"}); code != 7 {
		t.Fatalf("ExitError: exit %d", code)
	}
	if code := app(&out).Run(ctx, &testGrammar{}, []string{"--help"}); code != 0 {
		t.Fatalf("help: exit %d", code)
	}
	if code := app(&out).Run(ctx, &testGrammar{}, []string{"--no-such-flag"}); code != cli.ExitUsage {
		t.Fatalf("unknown flag: exit %d", code)
	}
}

func TestSecretNeverPrints(t *testing.T) {
	s := cli.Secret("hunter2")
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "pw", s)
	for _, got := range []string{s.String(), fmt.Sprint(s), fmt.Sprintf("%v %s %q %#v", s, s, s, s), logged.String()} {
		if strings.Contains(got, "hunter2") {
			t.Errorf("secret printed: %s", got)
		}
	}
	if s.Reveal() != "hunter2" {
		t.Fatal("Reveal")
	}
	if cli.Secret("").String() != "" {
		t.Fatal("empty secret must print empty")
	}
	d := cli.DSN("postgres://u:pw@h/db")
	logged.Reset()
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "dsn", d)
	if strings.Contains(logged.String(), ":pw@") || strings.Contains(fmt.Sprintf("%v %#v", d, d), ":pw@") {
		t.Errorf("dsn printed: %s", logged.String())
	}
}

func TestRedactDSN(t *testing.T) {
	cases := map[string]string{
		"": "",
		"postgres://u:pw@h:5432/db?sslmode=disable": "postgres://u:******@h:5432/db?sslmode=disable",
		"postgres://u@h/db":                         "postgres://u@h/db",
		"postgres://h/db?password=pw&user=u":        "postgres://h/db?password=******&user=u",
		"postgresql://u:p%40ss@h/db":                "postgresql://u:******@h/db",
		"host=h user=u password=pw dbname=d":        "host=h user=u password=****** dbname=d",
		"host=h password='p w' dbname=d":            "host=h password=****** dbname=d",
		"password=pw":                               "password=******",
		"host=h dbname=d":                           "host=h dbname=d",
		"postgres://u:pw@[bad":                      "postgres://******@[bad",
		"host=h password = 's3 \\'cret' dbname=d":   "host=h password = ****** dbname=d",
		"host=h sslpassword= pw2 password =pw":      "host=h sslpassword= ****** password =******",
		"postgres://u:pw@h1:5432,h2:5433/db":        "postgres://u:******@h1:5432,h2:5433/db",
		"https://h/x?api_key=k1&a=b&access_token=t": "https://h/x?api_key=******&a=b&access_token=******",
		"host=h password 'pw'":                      "host=h password ******",
	}
	for in, want := range cases {
		if got := cli.RedactDSN(in); got != want {
			t.Errorf("RedactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzRedactDSN(f *testing.F) {
	f.Add("pw12")
	f.Add("s3cr3t-Pa55")
	f.Fuzz(func(t *testing.T, pw string) {
		if len(pw) < 4 || strings.Trim(pw, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~") != "" {
			return // passwords that need no escaping in either form
		}
		for _, dsn := range []string{
			"postgres://user:" + pw + "@host/db",
			"host=h password=" + pw + " dbname=d",
		} {
			got := cli.RedactDSN(dsn)
			rest := strings.ReplaceAll(dsn, pw, "")
			if strings.Contains(got, pw) && !strings.Contains(rest+cli.Redacted, pw) {
				t.Fatalf("RedactDSN(%q) = %q leaks the password", dsn, got)
			}
		}
	})
}

// A negative number after a numeric flag is its value, so that validation reports the flag and
// its range; a bool flag never takes the next argument.
func TestNegativeValueAfterFlag(t *testing.T) {
	var out bytes.Buffer
	_, err := app(&out).Parse(&testGrammar{}, []string{"--batch-size", "-1", "--lease", "-2s"})
	if err == nil {
		t.Fatal("expected problems")
	}
	msg := err.Error()
	for _, want := range []string{"--batch-size: must be at least 1, got -1", "--lease: must be positive"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "short flag") {
		t.Errorf("negative value read as a short flag:\n%s", msg)
	}
	g := &testGrammar{}
	if _, err := app(&out).Parse(g, []string{"--batch-size", "7", "--migrate", "--lease=1s"}); err != nil || !g.Run.Migrate || g.Run.BatchSize != 7 {
		t.Fatalf("positive values and bool flags: %v %+v", err, g.Run)
	}
	if _, err := app(&out).Parse(&testGrammar{}, []string{"--migrate", "-1"}); err == nil {
		t.Fatal("a bool flag must not take -1 as its value")
	}
}

// A value from the environment that parses but fails validation names its variable; the same
// value on the command line does not.
func TestInvalidEnvValueNamesItsVariable(t *testing.T) {
	t.Setenv("KEIRO_T_BATCH_SIZE", "-1")
	t.Setenv("KEIRO_T_MECHANISM", "GSSAPI")
	var out bytes.Buffer
	_, err := app(&out).Parse(&testGrammar{}, nil)
	if err == nil {
		t.Fatal("expected problems")
	}
	for _, want := range []string{
		"--batch-size: must be at least 1, got -1 (from $KEIRO_T_BATCH_SIZE)",
		`--mechanism: unknown mechanism "GSSAPI" (from $KEIRO_T_MECHANISM)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%s", want, err)
		}
	}
	_, err = app(&out).Parse(&testGrammar{}, []string{"--batch-size=0", "--mechanism=X"})
	if err == nil || strings.Contains(err.Error(), "from $") {
		t.Fatalf("command-line values must not be blamed on the environment: %v", err)
	}
}
