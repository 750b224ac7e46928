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
	{"github.com/compose-spec/", "deploy/compose/validate (its own module)"},
	{"github.com/moby/", "deploy/compose/validate (its own module)"},
	{"github.com/chromedp/", "console/browsertest (its own module)"},
}

// module is this module's path.
const module = "github.com/keiro-go/keiro"

// Module and package budgets. outbox and inbox: the service of examples/minimal-service. All
// library packages: schema adds goavro, snappy, srclient and its jsonschema dependency.
const (
	maxModulesOutboxInbox = 20
	maxModulesLibrary     = 24
	// maxPackagesOutboxInbox counts third-party packages only: keiro's own (the internal
	// packages the library is split into) are not weight it brings with it.
	maxPackagesOutboxInbox = 85
)

// serviceForbidden are the packages outbox and inbox must not reach, with why: a service that
// never uses Avro or templates must not link them.
var serviceForbidden = []struct{ prefix, why string }{
	{"text/template", "templates reflect on methods by name, which turns off the linker's dead method elimination"},
	{"html/template", "templates reflect on methods by name, which turns off the linker's dead method elimination"},
	{"github.com/keiro-go/keiro/schema", "the Avro codec and the schema registry client are for the services that import schema"},
	{"github.com/linkedin/goavro", "the Avro codec belongs to package schema"},
	{"github.com/riferrei/srclient", "the schema registry client belongs to package schema"},
	{"github.com/twmb/franz-go/pkg/sr", "a schema registry client belongs to package schema"},
}

// goList runs go list -deps with format on pkgs from the module's root and returns the
// distinct non-empty lines, sorted.
func goList(t *testing.T, format string, pkgs ...string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	cmd := exec.Command(goBin, append([]string{"list", "-deps", "-f", format}, pkgs...)...)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", strings.Join(pkgs, " "), err, stderr.String())
	}
	var lines []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if line != "" && !slices.Contains(lines, line) {
			lines = append(lines, line)
		}
	}
	slices.Sort(lines)
	return lines
}

// modules returns the modules (the main one included) whose packages pkgs import, directly
// or not, in the build of this platform.
func modules(t *testing.T, pkgs ...string) []string {
	t.Helper()
	return goList(t, "{{with .Module}}{{.Path}}{{end}}", pkgs...)
}

// packages returns the import paths of the packages pkgs import, directly or not, themselves
// included, in the build of this platform; standard packages too when std is true.
func packages(t *testing.T, std bool, pkgs ...string) []string {
	t.Helper()
	if std {
		return goList(t, "{{.ImportPath}}", pkgs...)
	}
	return goList(t, "{{if not .Standard}}{{.ImportPath}}{{end}}", pkgs...)
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

// TestServiceAvoidsTemplatesAndAvro: a service importing outbox and inbox links neither
// text/template nor html/template nor the Avro codec and schema registry client, and at most
// maxPackagesOutboxInbox third-party packages.
func TestServiceAvoidsTemplatesAndAvro(t *testing.T) {
	t.Parallel()
	for _, pkg := range packages(t, true, "./outbox", "./inbox") {
		for _, f := range serviceForbidden {
			if pkg == f.prefix || strings.HasPrefix(pkg, f.prefix+"/") {
				t.Errorf("outbox or inbox reaches package %s: %s (go list -deps -f '{{.ImportPath}} {{.Imports}}' ./outbox ./inbox shows who imports it)", pkg, f.why)
			}
		}
	}
	var thirdParty []string
	for _, pkg := range packages(t, false, "./outbox", "./inbox") {
		if pkg != module && !strings.HasPrefix(pkg, module+"/") {
			thirdParty = append(thirdParty, pkg)
		}
	}
	if len(thirdParty) > maxPackagesOutboxInbox {
		t.Errorf("outbox and inbox reach %d third-party packages, more than the budget of %d:\n  %s",
			len(thirdParty), maxPackagesOutboxInbox, strings.Join(thirdParty, "\n  "))
	}
}
