package schemacli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/schema"
)

// DefaultTimeout bounds a whole command, retries included.
const DefaultTimeout = 30 * time.Second

// Exit codes.
const (
	// ExitOK means registered, or compatible.
	ExitOK = 0
	// ExitIncompatible means `schema check` found the schema incompatible.
	ExitIncompatible = 1
	// ExitError means a usage, configuration or registry problem.
	ExitError = 2
)

// EnvPrefix prefixes the environment variable of every flag: --registry-url is read from
// KEIRO_SCHEMA_REGISTRY_URL, --registry-user from KEIRO_SCHEMA_REGISTRY_USER, and so on.
const EnvPrefix = "KEIRO_SCHEMA"

// RegistryFlags are the registry connection flags.
type RegistryFlags struct {
	RegistryURL      string        `help:"Schema registry base URL, e.g. http://localhost:8081 (required)." placeholder:"URL"`
	RegistryUser     string        `help:"Basic-auth user for the registry."`
	RegistryPassword cli.Secret    `help:"Basic-auth password for the registry (a secret: never printed)."`
	RegistryCAFile   string        `name:"registry-ca-file" help:"PEM file of CA certificates to trust for the registry's TLS certificate." placeholder:"FILE"`
	RegistryCertFile string        `help:"PEM client certificate for mutual TLS with the registry." placeholder:"FILE"`
	RegistryKeyFile  string        `help:"PEM private key of --registry-cert-file." placeholder:"FILE"`
	Timeout          time.Duration `help:"Time limit for the whole command, retries included." default:"30s"`
}

// ValidateFlags reports every problem with the registry flags.
func (f *RegistryFlags) ValidateFlags() error {
	var p cli.Problems
	if f.RegistryURL == "" {
		p.Add("registry-url", "is required (or set %s_REGISTRY_URL)", EnvPrefix)
	}
	if (f.RegistryUser == "") != (f.RegistryPassword == "") {
		p.Add("registry-user", "and --registry-password go together: set both or neither")
	}
	if (f.RegistryCertFile == "") != (f.RegistryKeyFile == "") {
		p.Add("registry-cert-file", "and --registry-key-file go together: set both or neither")
	}
	if f.Timeout <= 0 {
		p.Add("timeout", "must be positive, got %s", f.Timeout)
	}
	return p.Err()
}

// Config returns the schema.RegistryConfig the flags describe.
func (f *RegistryFlags) Config() schema.RegistryConfig {
	return schema.RegistryConfig{URL: f.RegistryURL, Username: f.RegistryUser, Password: f.RegistryPassword.Reveal(),
		CAFile: f.RegistryCAFile, CertFile: f.RegistryCertFile, KeyFile: f.RegistryKeyFile}
}

type grammar struct {
	RegistryFlags `embed:""`
	Register      registerCmd `cmd:"" help:"Register the Avro schema in FILE under SUBJECT (a no-op if it is there already); print its id and version."`
	Check         checkCmd    `cmd:"" help:"Ask the registry whether the Avro schema in FILE is compatible with the latest version of SUBJECT. Exit 0 compatible, 1 incompatible, 2 error."`

	incompatible bool
}

type registerCmd struct {
	Subject string `arg:"" help:"Registry subject, e.g. orders.v1-value."`
	File    string `arg:"" help:"Avro schema file (.avsc)." type:"path"`
}

type checkCmd struct {
	Subject string `arg:"" help:"Registry subject, e.g. orders.v1-value."`
	File    string `arg:"" help:"Avro schema file (.avsc)." type:"path"`
}

// Run runs `relay schema …`: args are what follows "schema" on the command line (a leading
// "schema" is accepted too). It returns the process exit code: [ExitOK], [ExitIncompatible]
// or [ExitError].
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "schema" {
		args = args[1:]
	}
	if len(args) == 0 {
		args = []string{"--help"}
	}
	app := cli.App{Name: "relay schema", EnvPrefix: EnvPrefix, Stdout: stdout, Stderr: stderr,
		Description: "Manage Avro schemas in a Confluent-compatible Schema Registry."}
	g := &grammar{}
	code := app.Run(ctx, g, args)
	if code == cli.ExitFailure && !g.incompatible { // a failure, not the verdict "incompatible"
		return ExitError
	}
	return code
}

func (g *grammar) open(ctx context.Context) (*schema.Registry, context.Context, context.CancelFunc, error) {
	reg, err := schema.NewRegistry(g.Config())
	if err != nil {
		return nil, nil, nil, &cli.ExitError{Code: ExitError, Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, g.Timeout)
	return reg, ctx, cancel, nil
}

func readSchema(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", &cli.ExitError{Code: ExitError, Err: fmt.Errorf("read schema file: %w", err)}
	}
	return string(b), nil
}

// Run registers the schema.
func (c *registerCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	text, err := readSchema(c.File)
	if err != nil {
		return err
	}
	reg, ctx, cancel, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	defer reg.Close()
	s, err := reg.RegisterSchema(ctx, c.Subject, text)
	if err != nil {
		return &cli.ExitError{Code: ExitError, Err: hint(err)}
	}
	fmt.Fprintf(env.Stdout, "registered %s in subject %s: id %d, version %d, fingerprint %s\n",
		c.File, c.Subject, s.ID, s.Version, s.Fingerprint)
	return nil
}

// Run checks compatibility.
func (c *checkCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	text, err := readSchema(c.File)
	if err != nil {
		return err
	}
	reg, ctx, cancel, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	defer reg.Close()
	res, err := reg.CheckCompatibility(ctx, c.Subject, text)
	if err != nil {
		return &cli.ExitError{Code: ExitError, Err: hint(err)}
	}
	if res.Compatible {
		fmt.Fprintf(env.Stdout, "compatible: %s can be registered in subject %s\n", c.File, c.Subject)
		for _, m := range res.Messages {
			fmt.Fprintf(env.Stdout, "  %s\n", m)
		}
		return nil
	}
	fmt.Fprintf(env.Stdout, "incompatible: %s breaks the compatibility rule of subject %s\n", c.File, c.Subject)
	if len(res.Messages) == 0 {
		fmt.Fprintln(env.Stdout, "  (the registry gave no reason)")
	}
	for _, m := range res.Messages {
		fmt.Fprintf(env.Stdout, "  %s\n", m)
	}
	g.incompatible = true
	return &cli.ExitError{Code: ExitIncompatible}
}

// hint adds what to do next to the errors a user can fix.
func hint(err error) error {
	switch {
	case errors.Is(err, schema.ErrInvalidSchema):
		return fmt.Errorf("%w (fix the .avsc file)", err)
	case errors.Is(err, schema.ErrIncompatibleSchema):
		return fmt.Errorf("%w (run `relay schema check` to see why, or change the subject's compatibility level)", err)
	case errors.Is(err, schema.ErrRegistryUnavailable):
		var re *schema.RegistryError
		if errors.As(err, &re) && (re.Status == 401 || re.Status == 403) {
			return err // already says to check the user and password
		}
		return fmt.Errorf("%w (check --registry-url and that the registry is up)", err)
	}
	return err
}
