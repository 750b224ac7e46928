package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// result is what one in-process invocation of the relay's command line produced.
type result struct {
	code           int
	stdout, stderr string
}

// invoke runs the relay's command line in-process with args.
func invoke(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}
