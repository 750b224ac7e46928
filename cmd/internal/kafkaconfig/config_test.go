package kafkaconfig_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/kafkaconfig"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func ping(t *testing.T, cfg kafkaconfig.Config) error {
	t.Helper()
	opts, err := cfg.Opts()
	if err != nil {
		t.Fatalf("opts: %v", err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.RetryTimeout(2*time.Second))...)
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

func TestTLSHandshakeAgainstKfake(t *testing.T) {
	p := newPKI(t)
	c := testenv.NewKafkaWith(t, testenv.KafkaConfig{ClusterOpts: []kfake.Opt{
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12})}})

	ok := kafkaconfig.Config{Brokers: c.Seeds, ClientID: "kc-test", TLS: kafkaconfig.TLS{Enabled: true, CAFile: p.caFile}}
	if err := ping(t, ok); err != nil {
		t.Fatalf("TLS with our CA must connect: %v", err)
	}
	// The system pool does not trust the throwaway CA: the handshake must fail.
	untrusted := kafkaconfig.Config{Brokers: c.Seeds, TLS: kafkaconfig.TLS{Enabled: true}}
	if err := ping(t, untrusted); err == nil {
		t.Fatal("TLS without the CA must fail verification")
	}
	// Wrong server name: verification fails too.
	wrongName := ok
	wrongName.TLS.ServerName = "not-kafka.test"
	if err := ping(t, wrongName); err == nil {
		t.Fatal("TLS with a wrong server name must fail")
	}
	rightName := ok
	rightName.TLS.ServerName = "kafka.test"
	if err := ping(t, rightName); err != nil {
		t.Fatalf("TLS with the certificate's DNS name must connect: %v", err)
	}
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	c := testenv.NewKafkaWith(t, testenv.KafkaConfig{ClusterOpts: []kfake.Opt{kfake.TLS(&tls.Config{
		Certificates: []tls.Certificate{p.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.caPool,
		MinVersion:   tls.VersionTLS12,
	})}})
	noCert := kafkaconfig.Config{Brokers: c.Seeds, TLS: kafkaconfig.TLS{Enabled: true, CAFile: p.caFile}}
	if err := ping(t, noCert); err == nil {
		t.Fatal("a broker requiring client certificates must refuse a client without one")
	}
	withCert := noCert
	withCert.TLS.CertFile, withCert.TLS.KeyFile = p.clientCert, p.client
	if err := ping(t, withCert); err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}
}

func TestSASLAgainstKfake(t *testing.T) {
	for _, mech := range []string{kafkaconfig.MechanismPlain, kafkaconfig.MechanismScramSHA256, kafkaconfig.MechanismScramSHA512} {
		t.Run(mech, func(t *testing.T) {
			c := testenv.NewKafkaWith(t, testenv.KafkaConfig{ClusterOpts: []kfake.Opt{kfake.EnableSASL(), kfake.Superuser(mech, "keiro", "s3cret")}})
			good := kafkaconfig.Config{Brokers: c.Seeds, SASL: kafkaconfig.SASL{Mechanism: strings.ToLower(mech), Username: "keiro", Password: "s3cret"}}
			if err := ping(t, good); err != nil {
				t.Fatalf("%s with the right password: %v", mech, err)
			}
			bad := good
			bad.SASL.Password = "wrong"
			if err := ping(t, bad); err == nil {
				t.Fatalf("%s with a wrong password must fail", mech)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := kafkaconfig.Config{
		Brokers: []string{"localhost:9092", "no-port"},
		TLS:     kafkaconfig.TLS{Enabled: true, CAFile: garbage, CertFile: filepath.Join(dir, "missing.pem")},
		SASL:    kafkaconfig.SASL{Mechanism: "GSSAPI"},
	}
	err := cfg.ValidateFlags()
	if err == nil {
		t.Fatal("expected problems")
	}
	msg := err.Error()
	for _, want := range []string{
		`--brokers: "no-port" is not host:port`,
		"--kafka-tls-ca-file: load CA bundle",
		"--kafka-tls-key-file: is required with --kafka-tls-cert-file",
		`--kafka-sasl-mechanism: unknown mechanism "GSSAPI"`,
		"--kafka-sasl-username: is required",
		"--kafka-sasl-password: is required",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	if _, err := cfg.Opts(); err == nil {
		t.Fatal("Opts must refuse an invalid configuration")
	}

	cfg = kafkaconfig.Config{
		TLS:  kafkaconfig.TLS{CAFile: "/x", InsecureSkipVerify: true},
		SASL: kafkaconfig.SASL{Username: "u", Password: "p"},
	}
	msg = cfg.ValidateFlags().Error()
	for _, want := range []string{
		"--brokers: is required",
		"--kafka-tls-ca-file: is set but TLS is off",
		"--kafka-tls-insecure-skip-verify: is set but TLS is off",
		"--kafka-sasl-username: is set but no mechanism",
		"--kafka-sasl-password: is set but no mechanism",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}

	cfg = kafkaconfig.Config{Brokers: []string{"h:1"}, TLS: kafkaconfig.TLS{Enabled: true, CertFile: filepath.Join(dir, "nope.pem"), KeyFile: filepath.Join(dir, "nokey.pem")}}
	msg = cfg.ValidateFlags().Error()
	if !strings.Contains(msg, "--kafka-tls-cert-file: cannot read") || !strings.Contains(msg, "--kafka-tls-key-file: cannot read") {
		t.Errorf("unreadable files must each be named:\n%s", msg)
	}
}

func TestWarnings(t *testing.T) {
	cfg := kafkaconfig.Config{Brokers: []string{"h:1"}, SASL: kafkaconfig.SASL{Mechanism: "PLAIN", Username: "u", Password: "p"}}
	if w := cfg.Warnings(); len(w) != 1 || !strings.Contains(w[0], "clear text") {
		t.Fatalf("PLAIN without TLS must warn: %v", w)
	}
	cfg.TLS.Enabled = true
	if w := cfg.Warnings(); len(w) != 0 {
		t.Fatalf("no warning expected: %v", w)
	}
}

// The flags, as a command line would give them, never print the password.
type grammar struct {
	Kafka kafkaconfig.Config `embed:""`
}

func (g *grammar) Run() error { return nil }

func TestFlagsAndHelp(t *testing.T) {
	var out strings.Builder
	app := cli.App{Name: "x", EnvPrefix: "KEIRO_X", Stdout: &out, Stderr: &out}
	t.Setenv("KEIRO_X_KAFKA_SASL_PASSWORD", "pw-from-env")
	g := &grammar{}
	_, err := app.Parse(g, []string{"--brokers=a:1,b:2", "--kafka-sasl-mechanism=SCRAM-SHA-256", "--kafka-sasl-username=u"})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(g.Kafka.Brokers) != "[a:1 b:2]" || g.Kafka.SASL.Password.Reveal() != "pw-from-env" {
		t.Fatalf("parsed %+v", g.Kafka)
	}
	if s := fmt.Sprintf("%v %+v", g.Kafka, g.Kafka); strings.Contains(s, "pw-from-env") {
		t.Fatalf("config prints the password: %s", s)
	}
	_, err = app.Parse(&grammar{}, []string{"--help"})
	if err == nil || !strings.Contains(err.Error(), "help") {
		t.Fatalf("want help, got %v", err)
	}
	h := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"--brokers", "$KEIRO_X_BROKERS", "--kafka-tls-enabled", "$KEIRO_X_KAFKA_TLS_CA_FILE", "--kafka-sasl-mechanism", "$KEIRO_X_KAFKA_SASL_PASSWORD", "--client-id", "--kafka-tls-insecure-skip-verify", "--kafka-tls-server-name", "--kafka-tls-cert-file", "--kafka-tls-key-file"} {
		if !strings.Contains(h, want) {
			t.Errorf("help lacks %q:\n%s", want, h)
		}
	}
	if strings.Contains(h, "pw-from-env") {
		t.Fatal("help prints the password")
	}
}

// Every entry of --brokers is checked as host:port before anything connects: a host, and a
// numeric port from 1 to 65535.
func TestValidateBrokerAddresses(t *testing.T) {
	for _, ok := range []string{"localhost:9092", "10.0.0.1:1", "[::1]:65535", " k:9092 "} {
		cfg := kafkaconfig.Config{Brokers: []string{ok}}
		if err := cfg.ValidateFlags(); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"127.0.0.1:kafka": `"127.0.0.1:kafka" is not host:port: port "kafka" is not a number from 1 to 65535`,
		"k:0":             `port "0" is not a number from 1 to 65535`,
		"k:65536":         `port "65536" is not a number from 1 to 65535`,
		"k:-1":            `port "-1" is not a number from 1 to 65535`,
		":9092":           "the host is missing",
		"k":               "the port is missing",
		"::1:9092":        "too many colons",
		"":                "the entry is empty",
	} {
		cfg := kafkaconfig.Config{Brokers: []string{"ok:9092", bad}}
		err := cfg.ValidateFlags()
		if err == nil || !strings.Contains(err.Error(), "--brokers: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: want %q, got %v", bad, want, err)
		}
	}
}
