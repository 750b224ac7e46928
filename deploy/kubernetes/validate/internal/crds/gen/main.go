// Command gen regenerates the CustomResourceDefinitions of package crds: it runs controller-gen
// (sigs.k8s.io/controller-tools, version ControllerToolsVersion) on a copy of the Prometheus
// Operator's API module at the version the validate module requires, keeps the kinds the
// manifests use and stamps each with the module's version. Run it from package crds
// (`go generate ./internal/crds`).
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// controllerToolsVersion is the controller-gen release that generates the CRDs.
const controllerToolsVersion = "v0.23.0"

// monitoringModule is the module whose Go types define the custom resources.
const monitoringModule = "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring"

// kinds are the generated files kept: the resources the manifests may hold.
var kinds = []string{"servicemonitors", "podmonitors", "prometheusrules"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run() error {
	out, err := exec.Command("go", "list", "-m", "-json", monitoringModule).Output()
	if err != nil {
		return fmt.Errorf("find %s: %w", monitoringModule, err)
	}
	var mod struct{ Version, Dir string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return err
	}
	if mod.Dir == "" {
		return fmt.Errorf("%s %s is not downloaded: run go mod download", monitoringModule, mod.Version)
	}
	tmp, err := os.MkdirTemp("", "crds-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// A writable copy: the module cache is read-only and go/packages may write go.sum entries.
	src := filepath.Join(tmp, "src")
	if err := os.CopyFS(src, os.DirFS(mod.Dir)); err != nil {
		return fmt.Errorf("copy %s: %w", mod.Dir, err)
	}
	if err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chmod(p, 0o755)
	}); err != nil {
		return err
	}
	gen := exec.Command("go", "run", "sigs.k8s.io/controller-tools/cmd/controller-gen@"+controllerToolsVersion,
		"crd:crdVersions=v1,maxDescLen=0", "paths=./v1/.", "output:crd:dir="+filepath.Join(tmp, "out"))
	gen.Dir = src
	gen.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	gen.Stdout, gen.Stderr = os.Stderr, os.Stderr
	if err := gen.Run(); err != nil {
		return fmt.Errorf("controller-gen: %w", err)
	}
	stamp := fmt.Sprintf("    operator.prometheus.io/version: %s\n", strings.TrimPrefix(mod.Version, "v"))
	for _, k := range kinds {
		name := "monitoring.coreos.com_" + k + ".yaml"
		data, err := os.ReadFile(filepath.Join(tmp, "out", name))
		if err != nil {
			return err
		}
		anchor := []byte("    controller-gen.kubebuilder.io/version: " + controllerToolsVersion + "\n")
		if !bytes.Contains(data, anchor) {
			return fmt.Errorf("%s: no %q annotation to stamp the version after", name, strings.TrimSpace(string(anchor)))
		}
		data = bytes.Replace(data, anchor, append(anchor, stamp...), 1)
		if err := os.WriteFile(name, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
