package apiserver

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestBuildModulePinsTheClientRelease keeps the build module in step with the client modules:
// it requires k8s.io/kubernetes at Version, and each staging module kube-apiserver is compiled
// with is replaced by the release of k8s.io/api this module uses (Kubernetes v1.N.P publishes
// its staging modules as v0.N.P).
func TestBuildModulePinsTheClientRelease(t *testing.T) {
	data, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	api := requiredVersion(string(data), "k8s.io/client-go")
	if want := "v0" + strings.TrimPrefix(Version, "v1"); api != want {
		t.Fatalf("k8s.io/client-go is %s, kube-apiserver is built at %s (staging release %s): keep them equal", api, Version, want)
	}
	mod := string(goMod)
	if !regexp.MustCompile(`(?m)^require k8s\.io/kubernetes ` + regexp.QuoteMeta(Version) + `$|^\tk8s\.io/kubernetes ` + regexp.QuoteMeta(Version) + `$`).MatchString(mod) {
		t.Errorf("gomod/go.mod.txt does not require k8s.io/kubernetes %s", Version)
	}
	replaces := regexp.MustCompile(`(?m)^\t(k8s\.io/[a-z-]+) => (k8s\.io/[a-z-]+) (v\S+)$`).FindAllStringSubmatch(mod, -1)
	if len(replaces) < 20 {
		t.Fatalf("gomod/go.mod.txt replaces only %d staging modules", len(replaces))
	}
	for _, r := range replaces {
		if r[1] != r[2] || r[3] != api {
			t.Errorf("gomod/go.mod.txt: %s => %s %s, want => %s %s", r[1], r[2], r[3], r[1], api)
		}
	}
	for _, m := range []string{"k8s.io/api", "k8s.io/apimachinery", "k8s.io/apiserver", "k8s.io/client-go", "k8s.io/component-base", "k8s.io/kms", "k8s.io/apiextensions-apiserver", "k8s.io/kube-aggregator"} {
		if !strings.Contains(mod, "\t"+m+" => "+m+" ") {
			t.Errorf("gomod/go.mod.txt does not replace %s", m)
		}
	}
}

// requiredVersion returns the version at which go.mod's text requires module, or "".
func requiredVersion(gomod, module string) string {
	m := regexp.MustCompile(`(?m)^(?:require)?\s+` + regexp.QuoteMeta(module) + ` (v\S+)`).FindStringSubmatch(gomod)
	if m == nil {
		return ""
	}
	return m[1]
}
