package proc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// GoBinary is a command built from source once per machine: a module of its own whose go.mod
// and go.sum pin the release and every dependency, so a build on any machine compiles the same
// sources, compiled with the machine's Go into the per-machine cache (CacheDir).
type GoBinary struct {
	// Name is the binary's file name in the cache and its cache directory's prefix
	// (<cache>/keiro-go/<Name>-<Version>).
	Name string
	// What names the command in errors ("Jaeger").
	What string
	// Version is the release built.
	Version string
	// Package is the main package compiled.
	Package string
	// GoMod and GoSum are the build module's go.mod and go.sum.
	GoMod, GoSum []byte
	// BuildArgs are go build's arguments after -trimpath (always given) and before -o and the
	// package: -ldflags and the like.
	BuildArgs []string
	// CacheEnv names the environment variable that moves the cache (CacheDir); BinaryEnv the
	// one that points at a binary of Version to run instead of building one.
	CacheEnv, BinaryEnv string
}

// CacheDir returns the directory that holds the build: $<CacheEnv>/<Version>, else the user's
// cache directory (~/.cache/keiro-go/<Name>-<Version>).
func (g GoBinary) CacheDir() (string, error) { return CacheDir(g.CacheEnv, g.Name, g.Version, g.What) }

// Build returns the path of the binary: $<BinaryEnv> when set, else the one built once per
// machine from the pinned module. Concurrent callers, in this process or others, wait for one
// build; a build whose module files or arguments changed since is redone.
func (g GoBinary) Build(ctx context.Context) (string, error) {
	if bin := os.Getenv(g.BinaryEnv); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("%s: %w", g.BinaryEnv, err)
		}
		return bin, nil
	}
	dir, err := g.CacheDir()
	if err != nil {
		return "", err
	}
	unlock, err := LockDir(dir, g.What)
	if err != nil {
		return "", err
	}
	defer unlock()

	bin := filepath.Join(dir, g.Name)
	marker := filepath.Join(dir, "built")
	want := g.moduleHash()
	if old, err := os.ReadFile(marker); err == nil && string(old) == want {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("go not found: %s is built from source with the Go toolchain "+
			"(install Go 1.26 or later and put it on PATH), or set %s to a %s %s binary", g.What, g.BinaryEnv, g.What, g.Version)
	}
	_ = os.Remove(marker)
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", fmt.Errorf("create the %s build module's directory: %w", g.What, err)
	}
	if err := errors.Join(os.WriteFile(filepath.Join(src, "go.mod"), g.GoMod, 0o644),
		os.WriteFile(filepath.Join(src, "go.sum"), g.GoSum, 0o644)); err != nil {
		return "", fmt.Errorf("write the %s build module: %w", g.What, err)
	}
	tmp := bin + ".new"
	cmd := exec.CommandContext(ctx, goTool, slices.Concat([]string{"build"}, g.args(), []string{"-o", tmp, g.Package})...)
	cmd.Dir = src
	// A static binary from exactly the pinned module graph, whatever the caller's settings.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build %s %s (%s in %s): %w\n%s", g.What, g.Version, g.Package, src, err, Tail(out.String(), 40))
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("keep the %s binary: %w", g.What, err)
	}
	if err := os.WriteFile(marker, []byte(want), 0o644); err != nil {
		return "", fmt.Errorf("mark the %s binary built: %w", g.What, err)
	}
	return bin, nil
}

// args are go build's arguments before -o.
func (g GoBinary) args() []string { return append([]string{"-trimpath"}, g.BuildArgs...) }

// moduleHash identifies the build module's content and the build's arguments: a cached binary
// built from other module files or with other flags is rebuilt. A build with no BuildArgs
// hashes the module alone.
func (g GoBinary) moduleHash() string {
	h := sha256.New()
	h.Write(g.GoMod)
	h.Write([]byte{0})
	h.Write(g.GoSum)
	if len(g.BuildArgs) > 0 {
		h.Write([]byte{0})
		h.Write([]byte(strings.Join(g.args(), "\x00")))
	}
	return hex.EncodeToString(h.Sum(nil))
}
