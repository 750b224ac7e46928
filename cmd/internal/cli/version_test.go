package cli

import (
	"bytes"
	"context"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

func TestBuildInfoStampsAndFallback(t *testing.T) {
	read := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "v0.4.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	if b := buildInfo("", "", read); b != (BuildInfo{Version: "v0.4.0", Commit: "abc-dirty", GoVersion: "go1.99"}) {
		t.Fatalf("fallback: %+v", b)
	}
	if b := buildInfo("v1.2.3", "def", read); b.Version != "v1.2.3" || b.Commit != "def" {
		t.Fatalf("link-time stamps win: %+v", b)
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	if b := buildInfo("", "", none); b.Version != "(devel)" || b.Commit != "" || !strings.HasPrefix(b.GoVersion, "go") {
		t.Fatalf("no build info: %+v", b)
	}
	if s := (BuildInfo{Version: "v1", GoVersion: "go1"}).String(); s != "v1 (commit unknown, go1)" {
		t.Fatalf("String: %q", s)
	}
}

type versionGrammar struct {
	Version kong.VersionFlag `env:"-" help:"Print the version."`
	Run     struct{}         `cmd:"" default:"1"`
}

// --version prints the binary's name and build, and exits 0 without running a command.
func TestVersionFlag(t *testing.T) {
	var out bytes.Buffer
	a := App{Name: "t", EnvPrefix: "KEIRO_T", Stdout: &out, Stderr: &out}
	if code := a.Run(context.Background(), &versionGrammar{}, []string{"--version"}); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	if want := "t " + Build().String() + "\n"; out.String() != want {
		t.Fatalf("printed %q, want %q", out.String(), want)
	}
}
