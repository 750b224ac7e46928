package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

// --version prints the build and exits 0, before any configuration is checked.
func TestVersionFlag(t *testing.T) {
	r := invoke(t, "--version")
	if r.code != 0 || r.stdout != "relay "+cli.Build().String()+"\n" {
		t.Fatalf("--version: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// A release build stamps its version and commit with -ldflags; --version prints them.
func TestVersionStampedAtBuild(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "relay")
	const pkg = "github.com/keiro-go/keiro/cmd/internal/cli"
	build := exec.Command("go", "build", "-o", bin, "-ldflags", "-X "+pkg+".version=v1.2.3 -X "+pkg+".commit=0123abcd", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--version")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "KEIRO_RELAY_VERSION=ignored"}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "relay v1.2.3 (commit 0123abcd, go1.") {
		t.Fatalf("--version of a stamped build: %v %q", err, out)
	}
}
