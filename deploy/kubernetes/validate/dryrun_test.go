package validate

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keiro-go/keiro/deploy/kubernetes/validate/internal/apiserver"
	"github.com/keiro-go/keiro/deploy/kubernetes/validate/internal/crds"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// dryRunBundle is a real API server with the Prometheus Operator's CRDs installed, and clients
// for it.
type dryRunBundle struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	// warnings collects the server's warnings (deprecated fields and APIs, ignored values): a
	// manifest that draws one is reported as a problem.
	warnings *warningRecorder
}

// setupDryRun builds kube-apiserver once per machine (see apiserver.Build), starts it with
// etcd, installs the CRDs and creates the namespaces the kustomizations deploy into (so any
// subtest runs alone).
func setupDryRun(t *testing.T) *dryRunBundle {
	t.Helper()
	ctx := t.Context()
	start := time.Now()
	bin, err := apiserver.Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("built kube-apiserver %s in %s", apiserver.Version, d.Round(time.Second))
	}
	start = time.Now()
	srv, err := apiserver.Start(ctx, bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	t.Logf("kube-apiserver %s and etcd ready in %s", apiserver.Version, time.Since(start).Round(10*time.Millisecond))

	cfg := rest.CopyConfig(srv.Config)
	b := &dryRunBundle{warnings: &warningRecorder{}}
	cfg.WarningHandler = b.warnings
	if b.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := disco.ServerVersion(); err != nil {
		t.Fatalf("read the server's version: %v", err)
	} else if v.GitVersion != apiserver.Version {
		t.Fatalf("the server reports version %s, want %s", v.GitVersion, apiserver.Version)
	}
	cached := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	b.mapper = cached

	docs, err := crds.Documents()
	if err != nil {
		t.Fatal(err)
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, doc := range docs {
		var crd unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &crd.Object); err != nil {
			t.Fatal(err)
		}
		if _, err := b.dyn.Resource(crdGVR).Create(ctx, &crd, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("install CRD %s: %v", crd.GetName(), err)
		}
		waitEstablished(t, b.dyn.Resource(crdGVR), crd.GetName())
	}
	cached.Reset()

	// The namespaces the kustomizations deploy into, for real: objects in them need them.
	for _, dir := range kustomizations {
		for _, o := range buildUnstructured(t, dir) {
			if o.GetKind() != "Namespace" {
				continue
			}
			if _, err := b.dryRun(ctx, o); err != nil {
				t.Fatalf("create %s: %v", objectName(o), err)
			}
		}
	}
	return b
}

// waitEstablished waits until the CRD name is served.
func waitEstablished(t *testing.T, crds dynamic.ResourceInterface, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		crd, err := crds.Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("read CRD %s: %v", name, err)
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %s not established after 30s: %v", name, conds)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dryRun submits obj as `kubectl apply --dry-run=server --validate=strict` submits a new
// object: a create that the server validates, defaults and admits in full but does not store,
// with unknown and duplicate fields an error. Namespaces are created for real (objects in
// them need them; one that exists already, created by setupDryRun from the same manifest,
// counts as accepted). It returns the server's warnings and error.
func (b *dryRunBundle) dryRun(ctx context.Context, obj *unstructured.Unstructured) (warnings []string, err error) {
	gvk := obj.GroupVersionKind()
	m, err := b.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("the server does not serve %s: %w", gvk, err)
	}
	opts := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}
	var r dynamic.ResourceInterface = b.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		r = b.dyn.Resource(m.Resource).Namespace(ns)
	} else if gvk.Kind == "Namespace" {
		opts.DryRun = nil
	}
	b.warnings.reset()
	_, err = r.Create(ctx, obj, opts)
	if gvk.Kind == "Namespace" && apierrors.IsAlreadyExists(err) {
		err = nil
	}
	return b.warnings.reset(), err
}

// buildUnstructured runs kustomize on dir and returns its objects as the server receives them,
// namespaces first.
func buildUnstructured(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var nss, objs []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		// Through JSON, so that numbers are int64 as in any object the client decodes.
		data, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			t.Fatalf("built %s: %v", r.CurId(), err)
		}
		if u.GetKind() == "Namespace" {
			nss = append(nss, u)
		} else {
			objs = append(objs, u)
		}
	}
	return append(nss, objs...)
}

// objectName names an object as the tests report it: "Kind/name".
func objectName(u *unstructured.Unstructured) string {
	return u.GetKind() + "/" + u.GetName()
}

// TestAPIServerAcceptsAndRejects submits every object of every kustomization to a real
// kube-apiserver (server-side dry run, strict field validation) and expects each to be
// accepted without a warning (and a deprecated field to draw one); then submits real mistakes
// made to the example overlay's objects and expects each to be rejected with the field named.
// The API server's validation is the one a cluster applies: what the strict decoder cannot see
// (selectors against labels, name lengths, value ranges, the CRDs' OpenAPI schemas) is judged
// here.
func TestAPIServerAcceptsAndRejects(t *testing.T) {
	b := setupDryRun(t)

	for _, dir := range kustomizations {
		t.Run("accepts "+dir, func(t *testing.T) {
			start := time.Now()
			objs := buildUnstructured(t, dir)
			for _, o := range objs {
				warnings, err := b.dryRun(t.Context(), o)
				if err != nil {
					t.Errorf("%s rejected: %v", objectName(o), err)
				}
				for _, w := range warnings {
					t.Errorf("%s: the server warns: %s", objectName(o), w)
				}
			}
			if len(objs) < 10 {
				t.Errorf("submitted only %d objects; the build went wrong", len(objs))
			}
			t.Logf("%d objects accepted in %s", len(objs), time.Since(start).Round(time.Millisecond))
		})
	}

	// The accepting subtests fail on a warning: prove that one reaches them. The server admits a
	// deprecated node label but says so.
	t.Run("reports a warning", func(t *testing.T) {
		var target *unstructured.Unstructured
		for _, o := range buildUnstructured(t, "../overlays/example") {
			if objectName(o) == "Deployment/keiro-relay" {
				target = o
			}
		}
		if target == nil {
			t.Fatal("the example overlay has no Deployment/keiro-relay")
		}
		if err := unstructured.SetNestedStringMap(target.Object, map[string]string{"beta.kubernetes.io/arch": "amd64"}, "spec", "template", "spec", "nodeSelector"); err != nil {
			t.Fatal(err)
		}
		warnings, err := b.dryRun(t.Context(), target)
		if err != nil {
			t.Fatalf("rejected: %v", err)
		}
		if !slices.ContainsFunc(warnings, func(w string) bool {
			return strings.Contains(w, "spec.template.spec.nodeSelector[beta.kubernetes.io/arch]")
		}) {
			t.Fatalf("no warning about the deprecated node label; got %q", warnings)
		}
	})

	// Each mistake changes one object of the example overlay; the server must reject it with a
	// message naming the field.
	type mistake struct {
		name   string
		object string // kind/name in the overlay
		mutate func(t *testing.T, o map[string]any)
		want   []string // all in the server's message
	}
	set := func(t *testing.T, o map[string]any, value any, path ...string) {
		t.Helper()
		if err := unstructured.SetNestedField(o, value, path...); err != nil {
			t.Fatal(err)
		}
	}
	// container returns the first container of a Deployment's pod template, itself and not a
	// copy (unstructured's Nested* getters copy).
	container := func(t *testing.T, o map[string]any) map[string]any {
		t.Helper()
		podSpec := o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		cs, _ := podSpec["containers"].([]any)
		if len(cs) == 0 {
			t.Fatal("no containers")
		}
		return cs[0].(map[string]any)
	}
	for _, m := range []mistake{
		{
			name:   "selector that does not match the pod labels",
			object: "Deployment/keiro-consumer-billing",
			mutate: func(t *testing.T, o map[string]any) {
				set(t, o, map[string]any{"app.kubernetes.io/name": "someone-else"}, "spec", "selector", "matchLabels")
			},
			want: []string{"spec.template.metadata.labels", "`selector` does not match template `labels`"},
		},
		{
			name:   "container port name of 16 characters",
			object: "Deployment/keiro-consumer-billing",
			mutate: func(t *testing.T, o map[string]any) {
				ports := container(t, o)["ports"].([]any)
				ports[0].(map[string]any)["name"] = "http-keiro-admin"
			},
			want: []string{"spec.template.spec.containers[0].ports[0].name", "must be no more than 15 characters"},
		},
		{
			name:   "unknown field",
			object: "Deployment/keiro-relay",
			mutate: func(t *testing.T, o map[string]any) {
				c := container(t, o)
				c["readinessProbes"] = c["readinessProbe"]
			},
			want: []string{`unknown field "spec.template.spec.containers[0].readinessProbes"`},
		},
		{
			name:   "disruption budget above 100%",
			object: "PodDisruptionBudget/keiro-relay",
			mutate: func(t *testing.T, o map[string]any) {
				delete(o["spec"].(map[string]any), "minAvailable")
				set(t, o, "150%", "spec", "maxUnavailable")
			},
			want: []string{"spec.maxUnavailable", "must not be greater than 100%"},
		},
		{
			name:   "service port out of range",
			object: "Service/keiro-relay",
			mutate: func(t *testing.T, o map[string]any) {
				ports, _, _ := unstructured.NestedSlice(o, "spec", "ports")
				ports[0].(map[string]any)["port"] = int64(70000)
				set(t, o, ports, "spec", "ports")
			},
			want: []string{"spec.ports[0].port", "between 1 and 65535"},
		},
		{
			name:   "unknown field in a ServiceMonitor (the CRD's schema)",
			object: "ServiceMonitor/keiro-relay",
			mutate: func(t *testing.T, o map[string]any) {
				spec := o["spec"].(map[string]any)
				spec["endpoint"] = spec["endpoints"]
			},
			want: []string{`unknown field "spec.endpoint"`},
		},
	} {
		t.Run("rejects "+m.name, func(t *testing.T) {
			var target *unstructured.Unstructured
			for _, o := range buildUnstructured(t, "../overlays/example") {
				if objectName(o) == m.object {
					target = o
				}
			}
			if target == nil {
				t.Fatalf("the example overlay has no %s", m.object)
			}
			// The unchanged object passes, so the rejection is the mistake's.
			if _, err := b.dryRun(t.Context(), target.DeepCopy()); err != nil {
				t.Fatalf("unchanged %s rejected: %v", m.object, err)
			}
			m.mutate(t, target.Object)
			_, err := b.dryRun(t.Context(), target)
			if err == nil {
				t.Fatalf("%s with a %s accepted", m.object, m.name)
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) {
				t.Errorf("rejected, but not as invalid: %v", err)
			}
			t.Logf("rejected: %v", err)
			for _, w := range m.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the server's message does not mention %q: %v", w, err)
				}
			}
		})
	}
}

// TestCRDsMatchTheMonitoringModule keeps the installed CRDs at the version of the Prometheus
// Operator's API module the decoder uses: after bumping the module, `go generate ./internal/crds`.
func TestCRDsMatchTheMonitoringModule(t *testing.T) {
	const module = "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring"
	data, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(module) + ` v(\S+)$`).FindStringSubmatch(string(data))
	if m == nil {
		t.Fatalf("go.mod does not require %s", module)
	}
	version := m[1]
	docs, err := crds.Documents()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, doc := range docs {
		var crd unstructured.Unstructured
		if err := yaml.UnmarshalStrict(doc, &crd.Object); err != nil {
			t.Fatal(err)
		}
		if got := crd.GetAnnotations()[crds.OperatorVersionAnnotation]; got != version {
			t.Errorf("CRD %s was generated from %s %s, the module requires %s: run go generate ./internal/crds", crd.GetName(), module, got, version)
		}
		k, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
		kinds[k] = true
	}
	for _, want := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
		if !kinds[want] {
			t.Errorf("no CRD for %s", want)
		}
	}
}

// warningRecorder is a rest.WarningHandler that keeps the server's warnings.
type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

// HandleWarningHeader records one warning.
func (w *warningRecorder) HandleWarningHeader(code int, agent, text string) {
	if code != 299 || text == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

// reset returns the warnings recorded so far and forgets them.
func (w *warningRecorder) reset() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	msgs := w.msgs
	w.msgs = nil
	return msgs
}
