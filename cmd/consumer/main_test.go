package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// binary is the consumer built once for the end-to-end tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "keiro-consumer-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "consumer")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build consumer: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := testenv.Run(m) // kfake, pgx pools, HTTP servers and output readers: nothing may be left running
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// result is a finished run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

// runBinary runs the built consumer with args and env (KEY=VALUE, added to a clean
// environment) and waits for it, failing t after timeout.
func runBinary(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(baseEnv(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("consumer %s did not finish within %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), timeout, out.String(), errb.String())
	}
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run consumer: %v", err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// baseEnv is the environment of a started binary: PATH and HOME only, so that no
// KEIRO_CONSUMER_* variable of the developer's shell leaks in.
func baseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
}
