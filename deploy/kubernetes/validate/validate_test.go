package validate

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// kustomizations are the directories holding a kustomization.yaml.
var kustomizations = []string{"../base", "../overlays/example"}

// manifests returns the YAML files of dir other than its kustomization.
func manifests(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == "kustomization.yaml" })
}

// TestKustomizationsListEveryManifest decodes each kustomization.yaml strictly and checks that
// its resources are exactly the manifests beside it (plus other kustomization directories), so
// a file added without listing it, or listed and deleted, fails.
func TestKustomizationsListEveryManifest(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var k types.Kustomization
			if err := yaml.UnmarshalStrict(data, &k); err != nil {
				t.Fatalf("kustomization.yaml: %v", err)
			}
			if k.Kind != types.KustomizationKind || k.APIVersion != types.KustomizationVersion {
				t.Errorf("kustomization.yaml: apiVersion %q kind %q, want %s %s", k.APIVersion, k.Kind, types.KustomizationVersion, types.KustomizationKind)
			}
			listed := map[string]bool{}
			for _, r := range k.Resources {
				p := filepath.Join(dir, r)
				st, err := os.Stat(p)
				switch {
				case err != nil:
					t.Errorf("resource %s: %v", r, err)
				case st.IsDir():
					if _, err := os.Stat(filepath.Join(p, "kustomization.yaml")); err != nil {
						t.Errorf("resource %s is a directory without a kustomization.yaml", r)
					}
				default:
					listed[filepath.Clean(p)] = true
				}
			}
			for _, f := range manifests(t, dir) {
				if !listed[filepath.Clean(f)] {
					t.Errorf("%s is not listed in the kustomization's resources", f)
				}
			}
		})
	}
}

// TestManifestsDecodeStrictly decodes every document of every manifest into its API type.
func TestManifestsDecodeStrictly(t *testing.T) {
	n := 0
	for _, dir := range kustomizations {
		for _, f := range manifests(t, dir) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			docs, err := SplitDocuments(data)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for i, doc := range docs {
				if _, err := Decode(doc); err != nil {
					t.Errorf("%s document %d: %v", f, i+1, err)
				}
				n++
			}
		}
	}
	if n < 10 {
		t.Fatalf("decoded only %d documents; the manifests were not found", n)
	}
}

// The strict decoder is what catches a misspelt field: prove it does.
func TestDecodeRejectsUnknownFieldsAndKinds(t *testing.T) {
	for name, doc := range map[string]string{
		"misspelt field": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers:\n        - name: relay\n          readinesProbe: {}\n",
		"wrong type":     "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: {name: http}\n",
		"duplicate key":  "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nmetadata: {name: y}\n",
		"unknown kind":   "apiVersion: apps/v1\nkind: Deploymnet\nmetadata: {name: x}\n",
		"monitoring":     "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec:\n  endpoint: []\n",
	} {
		if _, err := Decode([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// build runs kustomize on dir and decodes every resulting object strictly.
func build(t *testing.T, dir string) []any {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var objs []any
	for _, r := range rm.Resources() {
		data, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		obj, err := Decode(data)
		if err != nil {
			t.Fatalf("built %s: %v", r.CurId(), err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// TestOverlayBuildsAndFollowsTheRules builds the example overlay and checks it: one relay
// Deployment, a consumer Deployment per bounded context, a native relay sidecar, and no rule
// of [Check] broken.
func TestOverlayBuildsAndFollowsTheRules(t *testing.T) {
	objs := build(t, "../overlays/example")
	for _, err := range Check(objs) {
		t.Error(err)
	}
	var relays, consumers, native int
	groups := map[string]bool{}
	for _, s := range Sidecars(objs) {
		switch {
		case s.Native:
			native++
		case s.Binary == "relay":
			relays++
		default:
			consumers++
			for _, e := range s.Container.Env {
				if e.Name == "KEIRO_CONSUMER_GROUP" {
					groups[e.Value] = true
				}
			}
		}
		if s.Namespace != "shop" {
			t.Errorf("%s is in namespace %q, want the overlay's shop", s.Workload, s.Namespace)
		}
		if !strings.Contains(s.Container.Image, "registry.example.com/keiro/keiro-") {
			t.Errorf("%s: image %q was not replaced by the overlay", s.Workload, s.Container.Image)
		}
	}
	if relays != 1 || consumers != 2 || native != 1 || len(groups) != 2 {
		t.Errorf("relay Deployments %d (want 1), consumer Deployments %d (want 2) in %d groups (want 2), native sidecars %d (want 1)", relays, consumers, len(groups), native)
	}
}

func TestBaseBuildsAndFollowsTheRules(t *testing.T) {
	for _, err := range Check(build(t, "../base")) {
		t.Error(err)
	}
}

// TestPrometheusRuleMatchesAlertsFile keeps the PrometheusRule and
// deploy/prometheus/alerts.yml (which promtool tests) identical.
func TestPrometheusRuleMatchesAlertsFile(t *testing.T) {
	data, err := os.ReadFile("../../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(data, &file); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	var rule *monitoringv1.PrometheusRule
	for _, o := range build(t, "../base") {
		if r, ok := o.(*monitoringv1.PrometheusRule); ok {
			rule = r
		}
	}
	if rule == nil {
		t.Fatal("the base has no PrometheusRule")
	}
	if len(file.Groups) == 0 || !reflect.DeepEqual(file.Groups, rule.Spec.Groups) {
		t.Fatalf("PrometheusRule %s differs from deploy/prometheus/alerts.yml: regenerate it from the file", rule.Name)
	}
}

// The rules catch what they claim to: each mutation of a good overlay is reported.
func TestCheckFindsProblems(t *testing.T) {
	mutate := func(name string, f func(d *appsv1.Deployment), want string) {
		t.Run(name, func(t *testing.T) {
			objs := build(t, "../overlays/example")
			for _, o := range objs {
				if d, ok := o.(*appsv1.Deployment); ok && d.Name == "keiro-consumer-billing" {
					f(d)
				}
			}
			errs := Check(objs)
			for _, err := range errs {
				if strings.Contains(err.Error(), want) {
					return
				}
			}
			t.Errorf("no problem mentions %q; got %v", want, errs)
		})
	}
	c := func(d *appsv1.Deployment) *corev1.Container { return &d.Spec.Template.Spec.Containers[0] }
	setEnv := func(d *appsv1.Deployment, name, value string) {
		for i, e := range c(d).Env {
			if e.Name == name {
				c(d).Env[i] = corev1.EnvVar{Name: name, Value: value}
				return
			}
		}
		c(d).Env = append(c(d).Env, corev1.EnvVar{Name: name, Value: value})
	}
	mutate("grace period equals the shutdown timeout", func(d *appsv1.Deployment) {
		g := int64(30)
		d.Spec.Template.Spec.TerminationGracePeriodSeconds = &g
		setEnv(d, "KEIRO_CONSUMER_SHUTDOWN_TIMEOUT", "30s")
	}, "KEIRO_CONSUMER_SHUTDOWN_TIMEOUT=30s leaves 0s under terminationGracePeriodSeconds=30")
	mutate("no explicit shutdown timeout", func(d *appsv1.Deployment) {
		c(d).Env = slices.DeleteFunc(c(d).Env, func(e corev1.EnvVar) bool { return e.Name == "KEIRO_CONSUMER_SHUTDOWN_TIMEOUT" })
	}, "KEIRO_CONSUMER_SHUTDOWN_TIMEOUT is not set")
	mutate("literal database URL", func(d *appsv1.Deployment) {
		setEnv(d, "KEIRO_CONSUMER_DATABASE_URL", "postgres://u:p@db/x")
	}, "set KEIRO_CONSUMER_DATABASE_URL_FILE")
	mutate("secret file outside a Secret mount", func(d *appsv1.Deployment) {
		setEnv(d, "KEIRO_CONSUMER_DATABASE_URL_FILE", "/etc/keiro/db")
	}, `KEIRO_CONSUMER_DATABASE_URL_FILE="/etc/keiro/db" is not inside a volumeMount of a Secret volume`)
	mutate("loopback listen address", func(d *appsv1.Deployment) {
		setEnv(d, "KEIRO_CONSUMER_HTTP_ADDR", "127.0.0.1:9465")
	}, "listen on 0.0.0.0")
	mutate("readiness probe on healthz", func(d *appsv1.Deployment) {
		c(d).ReadinessProbe.HTTPGet.Path = "/healthz"
	}, "readiness probe GETs /healthz, want /readyz")
	mutate("no liveness probe", func(d *appsv1.Deployment) { c(d).LivenessProbe = nil }, "no liveness probe")
	mutate("no memory limit", func(d *appsv1.Deployment) { delete(c(d).Resources.Limits, corev1.ResourceMemory) }, "no memory limit")
	mutate("writable root", func(d *appsv1.Deployment) {
		f := false
		c(d).SecurityContext.ReadOnlyRootFilesystem = &f
	}, "readOnlyRootFilesystem is not true")
	mutate("no disruption budget", func(d *appsv1.Deployment) {
		d.Spec.Template.Labels["app.kubernetes.io/instance"] = "other"
	}, "Deployment/keiro-consumer-billing: no PodDisruptionBudget selects its pods")
	mutate("not scraped", func(d *appsv1.Deployment) {
		c(d).Ports[0].Name = "metrics"
		c(d).LivenessProbe.HTTPGet.Port.StrVal = "metrics"
		c(d).ReadinessProbe.HTTPGet.Port.StrVal = "metrics"
	}, "no ServiceMonitor or PodMonitor scrapes it")

	t.Run("init container that is not a native sidecar", func(t *testing.T) {
		objs := build(t, "../overlays/example")
		for _, o := range objs {
			if d, ok := o.(*appsv1.Deployment); ok && d.Name == "orders-service" {
				d.Spec.Template.Spec.InitContainers[0].RestartPolicy = nil
			}
		}
		errs := Check(objs)
		if !slices.ContainsFunc(errs, func(err error) bool { return strings.Contains(err.Error(), "must set restartPolicy: Always") }) {
			t.Errorf("not reported: %v", errs)
		}
	})
}
