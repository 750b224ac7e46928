package main

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/internal/httpserver"
)

// "relay healthcheck" needs no database flags and answers for the binary's own HTTP server: 0
// while /readyz is 200, 1 once a readiness check fails.
func TestHealthcheckCommand(t *testing.T) {
	var notReady atomic.Bool
	srv, err := httpserver.Listen(httpserver.Config{Addr: "127.0.0.1:0", Checks: []httpserver.Check{{
		Name: "database",
		Run: func(context.Context) error {
			if notReady.Load() {
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

	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"healthcheck", "--http-addr=" + srv.Addr()}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())

	notReady.Store(true)
	out.Reset()
	errOut.Reset()
	code = run(context.Background(), []string{"healthcheck", "--http-addr=" + srv.Addr()}, &out, &errOut)
	require.Equal(t, 1, code)
	require.Contains(t, errOut.String(), "connection refused")
}
