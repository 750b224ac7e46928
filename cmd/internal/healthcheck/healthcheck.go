package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

// Command is the argument that selects the healthcheck: "relay healthcheck".
const Command = "healthcheck"

// Defaults of the command's flags.
const (
	// DefaultEndpoint is the endpoint checked: readiness (database and Kafka reachable), what a
	// compose depends_on condition: service_healthy waits for.
	DefaultEndpoint = "readyz"
	// DefaultTimeout bounds the whole request.
	DefaultTimeout = 3 * time.Second
)

// Cmd is the kong grammar of the healthcheck command. A binary lists it in its grammar (for
// --help) and dispatches to [Run] before parsing its own flags, so that the database flags its
// other commands require are not asked for.
type Cmd struct {
	HTTPAddr string        `name:"http-addr" help:"Address the binary serves /healthz and /readyz on (the run command's --http-addr); 0.0.0.0 and :: are checked on loopback." default:"${http_addr}" placeholder:"HOST:PORT"`
	Endpoint string        `help:"Endpoint to check: readyz (database and Kafka reachable) or healthz (process alive)." default:"${hc_endpoint}"`
	Timeout  time.Duration `help:"How long the check may take." default:"${hc_timeout}"`
}

// ValidateFlags reports an empty or malformed address and a non-positive timeout.
func (c *Cmd) ValidateFlags() error {
	var p cli.Problems
	if c.HTTPAddr == "" {
		p.Add("http-addr", "is empty: the HTTP server is disabled, so there is nothing to check; set the address the binary listens on")
	} else if _, err := target(c.HTTPAddr); err != nil {
		p.AddErr("http-addr", err)
	}
	if c.Endpoint != "readyz" && c.Endpoint != "healthz" {
		p.Add("endpoint", "unknown endpoint %q: use readyz or healthz", c.Endpoint)
	}
	if c.Timeout <= 0 {
		p.Add("timeout", "must be positive, got %s", c.Timeout)
	}
	return p.Err()
}

// Run performs the check, printing "ok" on stdout or the failure on stderr.
func (c *Cmd) Run(ctx context.Context, env *cli.Env) error {
	host, _ := target(c.HTTPAddr)
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	if err := Probe(ctx, host, c.Endpoint); err != nil {
		return &cli.ExitError{Code: cli.ExitFailure, Err: err}
	}
	fmt.Fprintf(env.Stdout, "ok: http://%s/%s\n", host, c.Endpoint)
	return nil
}

// Run runs "NAME healthcheck ARGS…" for the binary called name, whose flags read environment
// variables with envPrefix and whose HTTP server listens on defaultAddr unless configured. It
// returns the exit code: 0 healthy, 1 unhealthy or unreachable, 2 bad flags.
func Run(ctx context.Context, name, envPrefix, defaultAddr string, args []string, stdout, stderr io.Writer) int {
	app := cli.App{
		Name:        name + " " + Command,
		Description: "GET the binary's own /readyz (or /healthz) and exit 0 when it answers 200, 1 otherwise.",
		EnvPrefix:   envPrefix,
		Stdout:      stdout,
		Stderr:      stderr,
		Options:     []kong.Option{kong.Vars{"http_addr": defaultAddr, "hc_endpoint": DefaultEndpoint, "hc_timeout": DefaultTimeout.String()}},
	}
	return app.Run(ctx, &Cmd{}, args)
}

// target turns a listen address into the address to dial: an unspecified host (empty, 0.0.0.0,
// ::) becomes the loopback address of the same family.
func target(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("%q is not host:port: %w", listen, err)
	}
	if port == "" || port == "0" {
		return "", fmt.Errorf("%q has no fixed port to check", listen)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::", "[::]":
		host = "::1"
	}
	return net.JoinHostPort(host, port), nil
}

// Probe GETs http://hostport/endpoint and returns nil when the answer is 200 OK. Otherwise the
// error names the status and the start of the body (the failed readiness checks).
func Probe(ctx context.Context, hostport, endpoint string) error {
	url := "http://" + hostport + "/" + strings.TrimPrefix(endpoint, "/")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("build request for %s: %w", url, err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("GET %s: no answer in time: %w", url, err)
		}
		return fmt.Errorf("GET %s: %w; is the binary running and listening there (--http-addr)?", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
