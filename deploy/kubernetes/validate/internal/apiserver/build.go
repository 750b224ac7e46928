package apiserver

import (
	"context"
	_ "embed"
	"strings"

	"github.com/keiro-go/keiro/internal/proc"
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

// binary is kube-apiserver's command, built from the pinned module: a reproducible static
// binary stamped with its release as Kubernetes' own build stamps it (so /version reports
// Version, and the binary's version is Version rather than "v0.0.0-master").
var binary = proc.GoBinary{
	Name: "kube-apiserver", What: "kube-apiserver", Version: Version,
	Package: "k8s.io/kubernetes/cmd/kube-apiserver",
	GoMod:   goMod, GoSum: goSum,
	BuildArgs: []string{
		"-ldflags=-s -w" +
			" -X k8s.io/component-base/version.gitVersion=" + Version +
			" -X k8s.io/component-base/version.gitMajor=1" +
			" -X k8s.io/component-base/version.gitMinor=" + strings.Split(Version, ".")[1] +
			" -X k8s.io/component-base/version.gitTreeState=clean" +
			" -X k8s.io/client-go/pkg/version.gitVersion=" + Version,
	},
	CacheEnv: CacheEnv, BinaryEnv: BinaryEnv,
}

// CacheDir returns the directory that holds the build of Version: $KEIRO_KUBE_APISERVER_CACHE/<version>,
// else the user's cache directory (~/.cache/keiro-go/kube-apiserver-<version>).
func CacheDir() (string, error) { return binary.CacheDir() }

// Build returns the path of a kube-apiserver binary: KEIRO_KUBE_APISERVER_BINARY when set, else
// the one built once per machine from the pinned module (a cold build downloads the modules and
// compiles every package of kube-apiserver: about eleven minutes on two busy cores; afterwards
// it returns at once). Concurrent callers, in this process or others, wait for one build; a
// build whose module files changed since is redone.
func Build(ctx context.Context) (string, error) { return binary.Build(ctx) }
