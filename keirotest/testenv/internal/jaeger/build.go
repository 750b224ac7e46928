package jaeger

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/keiro-go/keiro/keirotest/testenv/internal/proc"
)

// The module that builds Jaeger: go.mod and go.sum pin the release and every dependency, so a
// build on any machine compiles the same sources. They are kept under other names so that Go
// does not take the directory for a module of the repository.
var (
	//go:embed gomod/go.mod.txt
	goMod []byte
	//go:embed gomod/go.sum.txt
	goSum []byte
)

// CacheEnv names the environment variable that moves the per-machine cache of built binaries
// (default: the user's cache directory, keiro-go/jaeger-<version>).
const CacheEnv = "KEIRO_JAEGER_CACHE"

// BinaryEnv names the environment variable that points at a Jaeger v2 binary to run instead of
// building one.
const BinaryEnv = "KEIRO_JAEGER_BINARY"

// mainPackage is the command Build compiles.
const mainPackage = "github.com/jaegertracing/jaeger/cmd/jaeger"

// CacheDir returns the directory that holds the build of Version: $KEIRO_JAEGER_CACHE/<version>,
// else the user's cache directory (~/.cache/keiro-go/jaeger-<version>).
func CacheDir() (string, error) { return proc.CacheDir(CacheEnv, "jaeger", Version, "Jaeger") }

// Build returns the path of a Jaeger binary: KEIRO_JAEGER_BINARY when set, else the one built
// once per machine from the pinned module (a cold build compiles about 1,500 packages: ten
// minutes or more on two cores). Concurrent callers, in this process or others, wait for one
// build; a build whose module files changed since is redone.
func Build(ctx context.Context) (string, error) {
	if bin := os.Getenv(BinaryEnv); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("%s: %w", BinaryEnv, err)
		}
		return bin, nil
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	unlock, err := proc.LockDir(dir, "Jaeger")
	if err != nil {
		return "", err
	}
	defer unlock()

	bin := filepath.Join(dir, "jaeger")
	marker := filepath.Join(dir, "built")
	want := moduleHash()
	if old, err := os.ReadFile(marker); err == nil && string(old) == want {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	_ = os.Remove(marker)
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", fmt.Errorf("create the Jaeger build module's directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), goMod, 0o644); err != nil {
		return "", fmt.Errorf("write the Jaeger build module: %w", err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.sum"), goSum, 0o644); err != nil {
		return "", fmt.Errorf("write the Jaeger build module: %w", err)
	}
	tmp := bin + ".new"
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", tmp, mainPackage)
	cmd.Dir = src
	// A static binary from exactly the pinned module graph, whatever the caller's settings.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build Jaeger %s (%s): %w\n%s", Version, mainPackage, err, proc.Tail(out.String(), 40))
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("keep the Jaeger binary: %w", err)
	}
	if err := os.WriteFile(marker, []byte(want), 0o644); err != nil {
		return "", fmt.Errorf("mark the Jaeger binary built: %w", err)
	}
	return bin, nil
}

// moduleHash identifies the build module's content: a cached binary built from other module
// files is rebuilt.
func moduleHash() string {
	h := sha256.New()
	h.Write(goMod)
	h.Write([]byte{0})
	h.Write(goSum)
	return hex.EncodeToString(h.Sum(nil))
}
