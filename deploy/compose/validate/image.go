package validate

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
)

// RequiredLabels are the OCI annotations every runnable image of the Dockerfile must carry.
var RequiredLabels = []string{"org.opencontainers.image.source", "org.opencontainers.image.title", "org.opencontainers.image.revision"}

// Image is what a runnable stage (one with an ENTRYPOINT, itself or through its base stages)
// produces, as far as running it is concerned.
type Image struct {
	// Stage is the stage's name.
	Stage string
	// Entrypoint is the exec-form ENTRYPOINT.
	Entrypoint []string
	// User is the last USER, "" when none is set (root).
	User string
	// Env are the ENV variables.
	Env map[string]string
	// Labels are the LABEL key/values.
	Labels map[string]string
	// Expose are the EXPOSEd ports ("9464" or "9464/tcp").
	Expose []string
	// Healthcheck is the exec-form HEALTHCHECK CMD, nil when none.
	Healthcheck []string
	// Runs are the RUN instructions of the stage and its base stages.
	Runs []Instruction
}

// Images returns the runnable stages of d, each with what it inherits from the stages it is
// built FROM.
func (d *Dockerfile) Images() []Image {
	byName := map[string]int{}
	for i, s := range d.Stages {
		if s.Name != "" {
			byName[s.Name] = i
		}
	}
	var out []Image
	for i, s := range d.Stages {
		chain := []int{i}
		for base, ok := byName[s.Base]; ok && base < chain[len(chain)-1]; base, ok = byName[d.Stages[base].Base] {
			chain = append(chain, base)
		}
		slices.Reverse(chain)
		img := Image{Stage: s.Name, Env: map[string]string{}, Labels: map[string]string{}}
		for _, idx := range chain {
			for _, in := range d.Stages[idx].Instructions {
				switch in.Cmd {
				case "ENTRYPOINT":
					img.Entrypoint = in.Args
				case "USER":
					img.User = strings.TrimSpace(in.Raw)
				case "ENV":
					for k, v := range keyValues(in.Raw) {
						img.Env[k] = v
					}
				case "LABEL":
					for k, v := range keyValues(in.Raw) {
						img.Labels[k] = v
					}
				case "EXPOSE":
					img.Expose = append(img.Expose, in.Args...)
				case "HEALTHCHECK":
					img.Healthcheck = nil // HEALTHCHECK NONE
					if len(in.Args) > 1 && strings.EqualFold(in.Args[0], "CMD") {
						img.Healthcheck = in.Args[1:]
						if !in.JSON {
							img.Healthcheck = strings.Fields(strings.Join(in.Args[1:], " "))
						}
					}
				case "RUN":
					img.Runs = append(img.Runs, in)
				}
			}
		}
		if len(img.Entrypoint) > 0 {
			out = append(out, img)
		}
	}
	return out
}

// keyValues splits `k=v k2="v 2"` (ENV and LABEL) into pairs; the legacy `ENV k v` form gives
// one pair.
func keyValues(raw string) map[string]string {
	out := map[string]string{}
	var words []string
	var cur strings.Builder
	inQuote := false
	for _, r := range raw {
		switch {
		case r == '"':
			inQuote = !inQuote
		case !inQuote && (r == ' ' || r == '\t'):
			if cur.Len() > 0 {
				words = append(words, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		words = append(words, cur.String())
	}
	if len(words) >= 1 && !strings.Contains(words[0], "=") {
		out[words[0]] = strings.Join(words[1:], " ")
		return out
	}
	for _, w := range words {
		k, v, _ := strings.Cut(w, "=")
		out[k] = v
	}
	return out
}

// HTTPAddrEnv returns the variable that sets the HTTP listen address of a keiro binary
// ("relay" → KEIRO_RELAY_HTTP_ADDR), or "" for another program.
func HTTPAddrEnv(binary string) string {
	if _, ok := AllowedEnv[binary]; !ok {
		return ""
	}
	return "KEIRO_" + strings.ToUpper(binary) + "_HTTP_ADDR"
}

// Binary returns the base name of the image's entrypoint ("relay").
func (img Image) Binary() string {
	if len(img.Entrypoint) == 0 {
		return ""
	}
	p := img.Entrypoint[0]
	return p[strings.LastIndex(p, "/")+1:]
}

// loopback reports whether a listen host only accepts connections from inside the container.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkImage reports what keeps a runnable image from working in a container: running as root,
// shipping an HTTP client (curl, wget) instead of calling the binary's healthcheck, missing OCI
// labels, and a keiro binary listening on loopback or on a port it does not EXPOSE.
func checkImage(img Image) []error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("image %q: "+format, append([]any{img.Stage}, args...)...))
	}
	user, _, _ := strings.Cut(img.User, ":")
	if user == "" || user == "root" || user == "0" {
		add("runs as root; add USER with an unprivileged numeric uid (as Kubernetes' runAsNonRoot needs)")
	}
	for _, run := range img.Runs {
		for _, w := range strings.Fields(run.Raw) {
			if w == "curl" || w == "wget" {
				add("line %d installs or runs %s; the image should not carry an HTTP client: healthchecks call the binary (relay healthcheck)", run.Line, w)
			}
		}
	}
	for _, l := range RequiredLabels {
		if img.Labels[l] == "" {
			add("has no %s label", l)
		}
	}
	if len(img.Healthcheck) > 0 && img.Healthcheck[0] != img.Entrypoint[0] {
		add("HEALTHCHECK runs %q, not the image's own binary %q", img.Healthcheck[0], img.Entrypoint[0])
	}
	env := HTTPAddrEnv(img.Binary())
	if env == "" {
		return errs
	}
	addr, ok := img.Env[env]
	if !ok {
		add("does not set %s: %s listens on loopback by default, which probes and scrapers outside the container cannot reach", env, img.Binary())
		return errs
	}
	host, port, err := net.SplitHostPort(addr)
	switch {
	case err != nil:
		add("%s=%q is not host:port", env, addr)
	case loopback(host):
		add("%s=%q listens on loopback, which probes and scrapers outside the container cannot reach", env, addr)
	case !slices.Contains(img.Expose, port) && !slices.Contains(img.Expose, port+"/tcp"):
		add("listens on port %s (%s) but EXPOSEs %v", port, env, img.Expose)
	}
	for _, e := range img.Expose {
		if p, _, _ := strings.Cut(e, "/"); err == nil && p != port {
			add("EXPOSEs %s, where nothing listens (%s=%s)", e, env, addr)
		}
	}
	return errs
}

// checkService reports a compose service built into img whose healthcheck does not call the
// image's own binary (the image has no shell and no curl), and published container ports where
// the binary does not listen.
func checkService(name string, s types.ServiceConfig, img Image) []error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("service %q: "+format, append([]any{name}, args...)...))
	}
	if hc := s.HealthCheck; hc != nil && !hc.Disable && len(hc.Test) > 0 {
		want := fmt.Sprintf(`["CMD", %q, "healthcheck"]`, img.Entrypoint[0])
		switch {
		case hc.Test[0] == "CMD-SHELL":
			add("healthcheck runs a shell command, but image %q has no shell; use %s", img.Stage, want)
		case hc.Test[0] == "CMD" && (len(hc.Test) < 2 || hc.Test[1] != img.Entrypoint[0]):
			add("healthcheck runs %v, but image %q only has %s; use %s", hc.Test[1:], img.Stage, img.Entrypoint[0], want)
		}
	}
	env := HTTPAddrEnv(img.Binary())
	if env == "" {
		return errs
	}
	addr := img.Env[env]
	if v, ok := s.Environment[env]; ok && v != nil {
		addr = *v
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		if len(s.Ports) > 0 {
			add("publishes ports, but %s=%q is not host:port", env, addr)
		}
		return errs
	}
	if len(s.Ports) > 0 && loopback(host) {
		add("publishes ports, but %s=%q listens on loopback inside the container", env, addr)
	}
	for _, p := range s.Ports {
		if strconv.Itoa(int(p.Target)) != port {
			add("publishes container port %d, but %s listens on %s", p.Target, img.Binary(), addr)
		}
	}
	return errs
}
