package healthcheck

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// server answers /readyz with status and /healthz with 200, on 127.0.0.1:PORT; it returns the
// port.
func server(t *testing.T, ready int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.WriteHeader(http.StatusOK)
		case "/readyz":
			w.WriteHeader(ready)
			_, _ = w.Write([]byte(`{"kafka":"dial tcp: connection refused"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	return port
}

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Run(context.Background(), "relay", "KEIRO_RELAY", "127.0.0.1:9464", args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestHealthcheckReady(t *testing.T) {
	port := server(t, http.StatusOK)
	code, out, errOut := run(t, "--http-addr=127.0.0.1:"+port)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "/readyz")
}

func TestHealthcheckNotReadyExits1WithTheAnswer(t *testing.T) {
	port := server(t, http.StatusServiceUnavailable)
	code, _, errOut := run(t, "--http-addr=127.0.0.1:"+port)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "503")
	require.Contains(t, errOut, "connection refused", "the failed check is shown")

	// The liveness endpoint of the same process answers 200.
	code, _, errOut = run(t, "--http-addr=127.0.0.1:"+port, "--endpoint=healthz")
	require.Equal(t, 0, code, errOut)
}

// The image sets KEIRO_RELAY_HTTP_ADDR=0.0.0.0:PORT for the run command; the healthcheck reads
// the same variable and dials loopback.
func TestHealthcheckReadsTheRunCommandsAddressFromTheEnvironment(t *testing.T) {
	port := server(t, http.StatusOK)
	t.Setenv("KEIRO_RELAY_HTTP_ADDR", "0.0.0.0:"+port)
	code, out, errOut := run(t)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "http://127.0.0.1:"+port+"/readyz")
}

func TestHealthcheckNothingListening(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	code, _, errOut := run(t, "--http-addr="+addr)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--http-addr")
}

func TestHealthcheckBadFlagsExit2(t *testing.T) {
	code, _, errOut := run(t, "--http-addr=", "--endpoint=metrics", "--timeout=0s")
	require.Equal(t, 2, code)
	for _, want := range []string{"--http-addr", "--endpoint", "--timeout"} {
		require.Contains(t, errOut, want)
	}
	code, _, errOut = run(t, "--http-addr=127.0.0.1:0")
	require.Equal(t, 2, code)
	require.True(t, strings.Contains(errOut, "no fixed port"), errOut)
}

func TestTarget(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0:9464":   "127.0.0.1:9464",
		":9465":          "127.0.0.1:9465",
		"[::]:8080":      "[::1]:8080",
		"10.0.0.7:9464":  "10.0.0.7:9464",
		"127.0.0.1:9464": "127.0.0.1:9464",
	} {
		got, err := target(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
}
