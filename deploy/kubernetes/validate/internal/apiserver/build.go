package apiserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Version is the Kubernetes release whose kube-apiserver Build compiles: the release of the
// k8s.io/api and k8s.io/client-go modules this module decodes and submits manifests with.
const Version = "v1.37.2"

// The module that builds kube-apiserver: go.mod requires k8s.io/kubernetes at Version and points
// each of its staging modules (k8s.io/api, k8s.io/apiserver, …, which its own go.mod replaces
// with directories of its repository) at the published release of the same number; go.sum pins
// every dependency, so a build on any machine compiles the same sources. They are kept under
// other names so that Go does not take the directory for a module of the repository.
var (
	//go:embed gomod/go.mod.txt
	goMod []byte
	//go:embed gomod/go.sum.txt
	goSum []byte
)

// CacheEnv names the environment variable that moves the per-machine cache of built binaries
// (default: the user's cache directory, keiro-go/kube-apiserver-<version>).
const CacheEnv = "KEIRO_KUBE_APISERVER_CACHE"

// BinaryEnv names the environment variable that points at a kube-apiserver binary of Version to
// run instead of building one.
const BinaryEnv = "KEIRO_KUBE_APISERVER_BINARY"

// mainPackage is the command Build compiles.
const mainPackage = "k8s.io/kubernetes/cmd/kube-apiserver"

// buildArgs are the arguments of go build before the package: a reproducible static binary
// stamped with its release as Kubernetes' own build stamps it (so /version reports Version, and
// the binary's version is Version rather than "v0.0.0-master").
var buildArgs = []string{
	"-trimpath",
	"-ldflags=-s -w" +
		" -X k8s.io/component-base/version.gitVersion=" + Version +
		" -X k8s.io/component-base/version.gitMajor=1" +
		" -X k8s.io/component-base/version.gitMinor=" + strings.Split(Version, ".")[1] +
		" -X k8s.io/component-base/version.gitTreeState=clean" +
		" -X k8s.io/client-go/pkg/version.gitVersion=" + Version,
}

// CacheDir returns the directory that holds the build of Version: $KEIRO_KUBE_APISERVER_CACHE/<version>,
// else the user's cache directory (~/.cache/keiro-go/kube-apiserver-<version>).
func CacheDir() (string, error) {
	if d := os.Getenv(CacheEnv); d != "" {
		return filepath.Join(d, Version), nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find a cache directory for kube-apiserver (set %s): %w", CacheEnv, err)
	}
	return filepath.Join(base, "keiro-go", "kube-apiserver-"+Version), nil
}

// Build returns the path of a kube-apiserver binary: KEIRO_KUBE_APISERVER_BINARY when set, else
// the one built once per machine from the pinned module (a cold build downloads the modules and
// compiles every package of kube-apiserver: about eleven minutes on two busy cores; afterwards
// it returns at once). Concurrent callers, in this process or others, wait for one build; a build whose module
// files changed since is redone.
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
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		return "", fmt.Errorf("create the kube-apiserver cache %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("open the kube-apiserver cache lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock the kube-apiserver cache: %w", err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()

	bin := filepath.Join(dir, "kube-apiserver")
	marker := filepath.Join(dir, "built")
	want := moduleHash()
	if old, err := os.ReadFile(marker); err == nil && string(old) == want {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("go not found: kube-apiserver is built from source with the Go toolchain " +
			"(install Go 1.26 or later and put it on PATH), or set " + BinaryEnv + " to a kube-apiserver " + Version + " binary")
	}
	_ = os.Remove(marker)
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(filepath.Join(src, "go.mod"), goMod, 0o644); err != nil {
		return "", fmt.Errorf("write the kube-apiserver build module: %w", err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.sum"), goSum, 0o644); err != nil {
		return "", fmt.Errorf("write the kube-apiserver build module: %w", err)
	}
	tmp := bin + ".new"
	cmd := exec.CommandContext(ctx, goTool, slices.Concat([]string{"build"}, buildArgs, []string{"-o", tmp, mainPackage})...)
	cmd.Dir = src
	// A static binary from exactly the pinned module graph, whatever the caller's settings.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build kube-apiserver %s (%s in %s): %w\n%s", Version, mainPackage, src, err, tail(out.String(), 40))
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("keep the kube-apiserver binary: %w", err)
	}
	if err := os.WriteFile(marker, []byte(want), 0o644); err != nil {
		return "", fmt.Errorf("mark the kube-apiserver binary built: %w", err)
	}
	return bin, nil
}

// moduleHash identifies the build module's content and the build's arguments: a cached binary
// built from other module files or with other flags is rebuilt.
func moduleHash() string {
	h := sha256.New()
	h.Write(goMod)
	h.Write([]byte{0})
	h.Write(goSum)
	h.Write([]byte{0})
	h.Write([]byte(strings.Join(buildArgs, "\x00")))
	return hex.EncodeToString(h.Sum(nil))
}
