package validate

import (
	"fmt"
	"net"
	"path"
	"slices"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ShutdownHeadroom is the least time a pod's terminationGracePeriodSeconds must leave after a
// keiro sidecar's --shutdown-timeout: closing the database pool and the Kafka client, leaving
// the consumer group and stopping the HTTP server happen after it.
const ShutdownHeadroom = 10 * time.Second

// defaultGracePeriod is Kubernetes' terminationGracePeriodSeconds when unset.
const defaultGracePeriod = 30 * time.Second

// JobNames are the Prometheus job labels the alert rules select on.
var JobNames = []string{"keiro-relay", "keiro-consumer"}

// secretFlags are the environment variables (after KEIRO_RELAY_ or KEIRO_CONSUMER_) that carry
// secrets: manifests must set their _FILE form, pointing into a mounted Secret.
var secretFlags = []string{"ADMIN_TOKEN", "DATABASE_URL", "KAFKA_SASL_PASSWORD", "HTTP_URL", "HTTP_HEADER", "SCHEMA_REGISTRY_URL", "SCHEMA_REGISTRY_PASSWORD"}

// Sidecar is one keiro container of a pod template.
type Sidecar struct {
	// Workload names the object holding the pod template ("Deployment/keiro-relay").
	Workload string
	// Binary is "relay" or "consumer".
	Binary string
	// Container is the container.
	Container corev1.Container
	// Native is true for an init container with restartPolicy: Always (a native sidecar).
	Native bool
	// Pod is the pod template.
	Pod corev1.PodTemplateSpec
	// Namespace is the workload's namespace.
	Namespace string
}

// Sidecars returns the keiro containers of the Deployments in objs: containers whose
// environment has KEIRO_RELAY_* or KEIRO_CONSUMER_ variables.
func Sidecars(objs []any) []Sidecar {
	var out []Sidecar
	for _, o := range objs {
		d, ok := o.(*appsv1.Deployment)
		if !ok {
			continue
		}
		add := func(c corev1.Container, native bool) {
			for _, bin := range []string{"relay", "consumer"} {
				prefix := "KEIRO_" + strings.ToUpper(bin) + "_"
				if slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return strings.HasPrefix(e.Name, prefix) }) {
					out = append(out, Sidecar{Workload: "Deployment/" + d.Name, Binary: bin, Container: c, Native: native, Pod: d.Spec.Template, Namespace: d.Namespace})
				}
			}
		}
		for _, c := range d.Spec.Template.Spec.InitContainers {
			add(c, c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways)
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			add(c, false)
		}
	}
	return out
}

// Check reports every way the built objects break the deployment rules, each naming the
// object: see [CheckSidecar] for the containers; besides, every Deployment has a
// PodDisruptionBudget selecting its pods, every keiro sidecar is scraped (a Service selected by
// a ServiceMonitor, or a PodMonitor) under a job the alert rules know, and every init
// container running a keiro binary is a native sidecar.
func Check(objs []any) []error {
	var errs []error
	sidecars := Sidecars(objs)
	for _, s := range sidecars {
		for _, err := range CheckSidecar(s) {
			errs = append(errs, fmt.Errorf("%s container %s: %w", s.Workload, s.Container.Name, err))
		}
		if !scraped(objs, s) {
			errs = append(errs, fmt.Errorf("%s container %s: no ServiceMonitor or PodMonitor scrapes it with job %s", s.Workload, s.Container.Name, strings.Join(JobNames, " or ")))
		}
	}
	for _, o := range objs {
		d, ok := o.(*appsv1.Deployment)
		if !ok {
			continue
		}
		if !slices.ContainsFunc(objs, func(o any) bool {
			pdb, ok := o.(*policyv1.PodDisruptionBudget)
			return ok && pdb.Namespace == d.Namespace && selects(pdb.Spec.Selector, d.Spec.Template.Labels)
		}) {
			errs = append(errs, fmt.Errorf("Deployment/%s: no PodDisruptionBudget selects its pods", d.Name))
		}
		for _, c := range d.Spec.Template.Spec.InitContainers {
			if slices.ContainsFunc(sidecars, func(s Sidecar) bool {
				return s.Workload == "Deployment/"+d.Name && s.Container.Name == c.Name && !s.Native
			}) {
				errs = append(errs, fmt.Errorf("Deployment/%s init container %s: a keiro sidecar must set restartPolicy: Always (a native sidecar), or the pod never starts its application", d.Name, c.Name))
			}
		}
	}
	return errs
}

// CheckSidecar reports what keeps one keiro container from running well: the HTTP address not
// reachable from outside the container or not a declared port; no /healthz liveness or
// /readyz readiness probe on it; missing resource requests or memory limit; a container that
// may run as root, escalate privileges or write its root filesystem; a secret given as a
// literal value instead of a _FILE pointing into a mounted Secret; and no explicit
// --shutdown-timeout, or one that leaves less than [ShutdownHeadroom] under the pod's grace
// period.
func CheckSidecar(s Sidecar) []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	c := s.Container
	prefix := "KEIRO_" + strings.ToUpper(s.Binary) + "_"
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}

	addrVar := prefix + "HTTP_ADDR"
	var portName string
	var portNum int32
	if e, ok := env[addrVar]; !ok || e.Value == "" {
		add("%s is not set: the binary listens on loopback by default, where probes and Prometheus cannot reach it", addrVar)
	} else if host, port, err := net.SplitHostPort(e.Value); err != nil {
		add("%s=%q is not host:port", addrVar, e.Value)
	} else {
		if host != "" && host != "0.0.0.0" && host != "::" {
			add("%s=%q: listen on 0.0.0.0 so the kubelet and Prometheus reach it", addrVar, e.Value)
		}
		for _, p := range c.Ports {
			if fmt.Sprint(p.ContainerPort) == port {
				portName, portNum = p.Name, p.ContainerPort
			}
		}
		if portName == "" {
			add("listens on port %s (%s) but declares no such containerPort", port, addrVar)
		}
	}
	probe := func(kind string, p *corev1.Probe, wantPath string) {
		switch {
		case p == nil:
			add("no %s probe: use GET %s", kind, wantPath)
		case p.HTTPGet == nil:
			add("%s probe is not an HTTP GET of %s", kind, wantPath)
		case p.HTTPGet.Path != wantPath:
			add("%s probe GETs %s, want %s", kind, p.HTTPGet.Path, wantPath)
		case portName != "" && !targets(p.HTTPGet.Port, portName, portNum):
			add("%s probe targets port %s, not the HTTP port %s (%d)", kind, p.HTTPGet.Port.String(), portName, portNum)
		}
	}
	probe("liveness", c.LivenessProbe, "/healthz")
	probe("readiness", c.ReadinessProbe, "/readyz")

	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			add("no %s request", r)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		add("no memory limit")
	}

	sc := c.SecurityContext
	podSC := s.Pod.Spec.SecurityContext
	nonRoot := sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot || podSC != nil && podSC.RunAsNonRoot != nil && *podSC.RunAsNonRoot
	if !nonRoot {
		add("runAsNonRoot is not set (pod or container)")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		add("allowPrivilegeEscalation is not false")
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		add("readOnlyRootFilesystem is not true")
	}

	for _, name := range secretFlags {
		if e, ok := env[prefix+name]; ok && (e.Value != "" || e.ValueFrom != nil) {
			add("%s is set in the manifest; set %s_FILE to a file mounted from a Secret instead", prefix+name, prefix+name)
		}
	}
	for _, e := range c.Env {
		if !strings.HasSuffix(e.Name, "_FILE") || !strings.HasPrefix(e.Name, prefix) {
			continue
		}
		if !mountedSecret(s.Pod.Spec, c, e.Value) {
			add("%s=%q is not inside a volumeMount of a Secret volume", e.Name, e.Value)
		}
	}

	grace := defaultGracePeriod
	if g := s.Pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	shutdownVar := prefix + "SHUTDOWN_TIMEOUT"
	if e, ok := env[shutdownVar]; !ok {
		add("%s is not set: state the shutdown timeout next to terminationGracePeriodSeconds so the two cannot drift apart", shutdownVar)
	} else if d, err := time.ParseDuration(e.Value); err != nil {
		add("%s=%q: %v", shutdownVar, e.Value, err)
	} else if d+ShutdownHeadroom > grace {
		add("%s=%s leaves %s under terminationGracePeriodSeconds=%d; keep at least %s of headroom (raise the grace period or lower the timeout)", shutdownVar, d, grace-d, int(grace.Seconds()), ShutdownHeadroom)
	}
	return errs
}

func targets(p intstr.IntOrString, name string, num int32) bool {
	if p.Type == intstr.String {
		return p.StrVal == name
	}
	return p.IntVal == num
}

// mountedSecret reports whether file lies under a mount of a Secret volume in container c.
func mountedSecret(pod corev1.PodSpec, c corev1.Container, file string) bool {
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(path.Clean(file), path.Clean(m.MountPath)+"/") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && (v.Secret != nil || v.Projected != nil && slices.ContainsFunc(v.Projected.Sources, func(p corev1.VolumeProjection) bool { return p.Secret != nil })) {
				return true
			}
		}
	}
	return false
}

func selects(sel *metav1.LabelSelector, set map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !s.Empty() && s.Matches(labels.Set(set))
}

// scraped reports whether a ServiceMonitor (through a Service selecting the pod) or a
// PodMonitor scrapes the sidecar's HTTP port, with a job label the alert rules select on.
func scraped(objs []any, s Sidecar) bool {
	ports := map[string]bool{}
	for _, p := range s.Container.Ports {
		ports[p.Name] = true
	}
	for _, o := range objs {
		switch m := o.(type) {
		case *monitoringv1.PodMonitor:
			if m.Namespace != s.Namespace || !selects(&m.Spec.Selector, s.Pod.Labels) || !slices.Contains(JobNames, s.Pod.Labels[m.Spec.JobLabel]) {
				continue
			}
			for _, ep := range m.Spec.PodMetricsEndpoints {
				if ep.Port != nil && ports[*ep.Port] {
					return true
				}
			}
		case *monitoringv1.ServiceMonitor:
			for _, o := range objs {
				svc, ok := o.(*corev1.Service)
				if !ok || svc.Namespace != s.Namespace || m.Namespace != s.Namespace || !selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, s.Pod.Labels) ||
					!selects(&m.Spec.Selector, svc.Labels) || !slices.Contains(JobNames, svc.Labels[m.Spec.JobLabel]) {
					continue
				}
				for _, ep := range m.Spec.Endpoints {
					for _, sp := range svc.Spec.Ports {
						if sp.Name == ep.Port && sp.TargetPort.Type == intstr.String && ports[sp.TargetPort.StrVal] {
							return true
						}
					}
				}
			}
		}
	}
	return false
}
