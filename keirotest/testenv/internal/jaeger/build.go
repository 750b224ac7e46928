package jaeger

import (
	"context"
	_ "embed"

	"github.com/keiro-go/keiro/internal/proc"
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

// binary is Jaeger v2's command, built from the pinned module.
var binary = proc.GoBinary{
	Name: "jaeger", What: "Jaeger", Version: Version,
	Package: "github.com/jaegertracing/jaeger/cmd/jaeger",
	GoMod:   goMod, GoSum: goSum,
	CacheEnv: CacheEnv, BinaryEnv: BinaryEnv,
}

// CacheDir returns the directory that holds the build of Version: $KEIRO_JAEGER_CACHE/<version>,
// else the user's cache directory (~/.cache/keiro-go/jaeger-<version>).
func CacheDir() (string, error) { return binary.CacheDir() }

// Build returns the path of a Jaeger binary: KEIRO_JAEGER_BINARY when set, else the one built
// once per machine from the pinned module (a cold build compiles about 1,500 packages: ten
// minutes or more on two cores). Concurrent callers, in this process or others, wait for one
// build; a build whose module files changed since is redone.
func Build(ctx context.Context) (string, error) { return binary.Build(ctx) }
