package main

import (
	"context"
	"io"
	"testing"

	"github.com/keiro-go/keiro/cmd/internal/healthcheck/healthchecktest"
)

// "consumer healthcheck" needs no database flags and answers for the binary's own HTTP server: 0
// while /readyz is 200, 1 once a readiness check fails.
func TestHealthcheckCommand(t *testing.T) {
	healthchecktest.Command(t, func(args []string, stdout, stderr io.Writer) int {
		return run(context.Background(), args, stdout, stderr)
	})
}
