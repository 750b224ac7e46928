package depcheck

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// libraryPackages are the packages a service imports to use keiro as a library.
var libraryPackages = []string{"./outbox", "./inbox", "./events", "./envelope", "./schema", "./tracing"}

// forbidden are the module path prefixes no library package may reach, with the opt-in place
// each belongs to instead.
var forbidden = []struct{ prefix, belongs string }{
	{"go.opentelemetry.io/otel/sdk", "tracing/otelsetup"},
	{"go.opentelemetry.io/otel/exporters/", "tracing/otelsetup"},
	{"go.opentelemetry.io/proto/", "tracing/otelsetup"},
	{"google.golang.org/grpc", "tracing/otelsetup"},
	{"google.golang.org/protobuf", "tracing/otelsetup"},
	{"google.golang.org/genproto", "tracing/otelsetup"},
	{"github.com/grpc-ecosystem/", "tracing/otelsetup"},
	{"github.com/prometheus/", "tracing/otelsetup"},
	{"github.com/jackc/tern", "migrations"},
	{"github.com/Masterminds/", "migrations"},
	{"dario.cat/mergo", "migrations"},
	{"github.com/compose-spec/", "internal/composecheck (its own module)"},
	{"github.com/moby/", "internal/composecheck (its own module)"},
	{"github.com/chromedp/", "console/browsertest (its own module)"},
}

// Module budgets. outbox and inbox: the service of examples/minimal-service. All library
// packages: schema adds goavro, snappy, srclient and its jsonschema dependency.
const (
	maxModulesOutboxInbox = 20
	maxModulesLibrary     = 24
)

// modules returns the modules (the main one included) whose packages pkgs import, directly
// or not, in the build of this platform.
func modules(t *testing.T, pkgs ...string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	cmd := exec.Command(goBin, append([]string{"list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}"}, pkgs...)...)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", strings.Join(pkgs, " "), err, stderr.String())
	}
	var mods []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if line != "" && !slices.Contains(mods, line) {
			mods = append(mods, line)
		}
	}
	slices.Sort(mods)
	return mods
}

// TestLibraryPackagesDependOnTheAPIOnly: no library package reaches the OpenTelemetry SDK or
// exporters, gRPC, protobuf, Prometheus, the migration runner or the QA-only tools.
func TestLibraryPackagesDependOnTheAPIOnly(t *testing.T) {
	t.Parallel()
	for _, pkg := range libraryPackages {
		for _, mod := range modules(t, pkg) {
			for _, f := range forbidden {
				if strings.HasPrefix(mod, f.prefix) {
					t.Errorf("%s reaches module %s: it belongs to %s, which library packages must not import (go mod why -m %s)", pkg, mod, f.belongs, mod)
				}
			}
		}
	}
}

// TestModuleBudget: a service importing outbox and inbox links at most maxModulesOutboxInbox
// modules, all library packages together at most maxModulesLibrary.
func TestModuleBudget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pkgs []string
		max  int
	}{
		{[]string{"./outbox", "./inbox"}, maxModulesOutboxInbox},
		{libraryPackages, maxModulesLibrary},
	} {
		mods := modules(t, c.pkgs...)
		if len(mods) > c.max {
			t.Errorf("%s reach %d modules, more than the budget of %d: a new dependency of a library package belongs in an opt-in package or needs a decision (docs/benchmarks-history.md, \"Dependencies and binary size\"):\n  %s",
				strings.Join(c.pkgs, " "), len(mods), c.max, strings.Join(mods, "\n  "))
		}
	}
}
