// Package healthchecktest serves a binary's HTTP server with one readiness check a test can
// fail, for the tests of each binary's healthcheck subcommand.
package healthchecktest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/internal/httpserver"
)

// Server is an HTTP server of the binaries' kind with a "database" readiness check.
type Server struct {
	// Addr is the server's listening address.
	Addr     string
	notReady atomic.Bool
}

// Serve starts a Server on a free loopback port until the test ends.
func Serve(t testing.TB) *Server {
	t.Helper()
	s := &Server{}
	srv, err := httpserver.Listen(httpserver.Config{Addr: "127.0.0.1:0", Checks: []httpserver.Check{{
		Name: "database",
		Run: func(context.Context) error {
			if s.notReady.Load() {
				return errors.New("connection refused")
			}
			return nil
		},
	}}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	s.Addr = srv.Addr()
	return s
}

// FailReadiness makes the readiness check fail with "connection refused" from now on.
func (s *Server) FailReadiness() { s.notReady.Store(true) }

// Command checks a binary's healthcheck subcommand: run(args, stdout, stderr) runs the binary
// with args and returns its exit code. "healthcheck --http-addr=<server>" must exit 0 while the
// server is ready, and 1, naming the failed check's error, once it is not.
func Command(t *testing.T, run func(args []string, stdout, stderr io.Writer) int) {
	t.Helper()
	srv := Serve(t)
	check := func() (int, string) {
		var out, errOut bytes.Buffer
		code := run([]string{"healthcheck", "--http-addr=" + srv.Addr}, &out, &errOut)
		return code, errOut.String()
	}
	code, errOut := check()
	require.Equal(t, 0, code, errOut)
	srv.FailReadiness()
	code, errOut = check()
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "connection refused")
}
