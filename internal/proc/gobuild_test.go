package proc_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/internal/proc"
)

// A GoBinary is built once into its cache, reused while its module is unchanged, rebuilt when
// the module changes, and replaced by the binary its BinaryEnv names.
func TestGoBinaryBuildsOnceAndRebuildsOnChange(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("KEIRO_TEST_GOBINARY_CACHE", cache)
	t.Setenv("KEIRO_TEST_GOBINARY", "")
	g := proc.GoBinary{
		Name: "gofmt", What: "gofmt", Version: "test",
		Package:  "cmd/gofmt", // a command of the toolchain: builds without the network
		GoMod:    []byte("module example.com/gobinary\n\ngo 1.26\n"),
		CacheEnv: "KEIRO_TEST_GOBINARY_CACHE", BinaryEnv: "KEIRO_TEST_GOBINARY",
	}
	dir, err := g.CacheDir()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(cache, "test"), dir)

	bin, err := g.Build(context.Background())
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "gofmt"), bin)
	cmd := exec.Command(bin)
	cmd.Stdin = strings.NewReader("package   p\n")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the built binary runs: %s", out)
	require.Equal(t, "package p\n", string(out))
	first, err := os.Stat(bin)
	require.NoError(t, err)

	again, err := g.Build(context.Background())
	require.NoError(t, err)
	same, err := os.Stat(again)
	require.NoError(t, err)
	require.True(t, os.SameFile(first, same), "an unchanged module is not rebuilt")

	g.BuildArgs = []string{"-ldflags=-s -w"}
	rebuilt, err := g.Build(context.Background())
	require.NoError(t, err)
	other, err := os.Stat(rebuilt)
	require.NoError(t, err)
	require.False(t, os.SameFile(first, other), "other build arguments rebuild")

	t.Setenv("KEIRO_TEST_GOBINARY", bin)
	named, err := g.Build(context.Background())
	require.NoError(t, err)
	require.Equal(t, bin, named)
	t.Setenv("KEIRO_TEST_GOBINARY", filepath.Join(cache, "missing"))
	_, err = g.Build(context.Background())
	require.ErrorContains(t, err, "KEIRO_TEST_GOBINARY")
}

// A build that fails says what failed, with the compiler's last lines.
func TestGoBinaryBuildFailureSaysWhy(t *testing.T) {
	t.Setenv("KEIRO_TEST_GOBINARY_CACHE", t.TempDir())
	t.Setenv("KEIRO_TEST_GOBINARY", "")
	g := proc.GoBinary{
		Name: "nothing", What: "Nothing", Version: "test", Package: "example.com/gobinary/none",
		GoMod:    []byte("module example.com/gobinary\n\ngo 1.26\n"),
		CacheEnv: "KEIRO_TEST_GOBINARY_CACHE", BinaryEnv: "KEIRO_TEST_GOBINARY",
	}
	_, err := g.Build(context.Background())
	require.ErrorContains(t, err, "build Nothing test (example.com/gobinary/none")
}
