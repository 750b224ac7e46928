package validate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// LoadProject loads the compose file at path with compose-go, with every profile enabled,
// interpolating variables from env only (nil: none, so every ${VAR:-default} takes its
// default) and resolving relative paths against the file's directory.
func LoadProject(ctx context.Context, path string, env []string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{path},
		cli.WithWorkingDirectory(filepath.Dir(path)),
		cli.WithEnv(env),
		cli.WithResolvedPaths(true),
		cli.WithProfiles([]string{"*"}), // check services behind profiles too
	)
	if err != nil {
		return nil, fmt.Errorf("compose options for %s: %w", path, err)
	}
	p, err := opts.LoadProject(ctx)
	if err != nil {
		return nil, fmt.Errorf("load compose file %s: %w", path, err)
	}
	return p, nil
}

// CheckProject reports every problem of a loaded project at once (joined), or nil:
// depends_on targets that do not exist, service_healthy targets without a healthcheck,
// service_completed_successfully targets that restart, missing build contexts, Dockerfiles and
// targets, missing bind-mount sources, colliding published host ports, KEIRO_* variables
// outside [AllowedEnv] or missing from [RequiredEnv], and services built from the Dockerfile
// without a healthcheck, or whose healthcheck or published ports do not fit the image built
// (see [Image]), and consumer topics (and their dead-letter topics) that [TopicInitService]
// does not create.
func CheckProject(p *types.Project) error {
	var errs []error
	add := func(service, format string, args ...any) {
		errs = append(errs, fmt.Errorf("service %q: "+format, append([]any{service}, args...)...))
	}
	names := slices.Sorted(maps.Keys(p.Services))
	type portUse struct {
		service, hostIP string
	}
	published := map[string][]portUse{} // "port/proto" → users

	for _, name := range names {
		s := p.Services[name]
		for _, dep := range slices.Sorted(maps.Keys(s.DependsOn)) {
			cond := s.DependsOn[dep].Condition
			target, ok := p.Services[dep]
			if !ok {
				add(name, "depends_on %q, which is not a service", dep)
				continue
			}
			switch cond {
			case types.ServiceConditionHealthy:
				if target.HealthCheck == nil || target.HealthCheck.Disable || len(target.HealthCheck.Test) == 0 {
					add(name, "waits for %q to be healthy, but %q has no healthcheck", dep, dep)
				}
			case types.ServiceConditionCompletedSuccessfully:
				if target.Restart != "" && target.Restart != types.RestartPolicyNo {
					add(name, "waits for %q to complete, but %q restarts (%s)", dep, dep, target.Restart)
				}
			}
		}

		if b := s.Build; b != nil {
			if st, err := os.Stat(b.Context); err != nil || !st.IsDir() {
				add(name, "build context %s does not exist", b.Context)
			} else {
				df := b.Dockerfile
				if df == "" {
					df = "Dockerfile"
				}
				if !filepath.IsAbs(df) {
					df = filepath.Join(b.Context, df)
				}
				if _, err := os.Stat(df); err != nil {
					add(name, "Dockerfile %s does not exist", df)
				} else if b.Target != "" {
					d, err := ParseDockerfile(df)
					if err != nil {
						add(name, "%v", err)
					} else if !slices.Contains(d.StageNames(), b.Target) {
						add(name, "build target %q is not a stage of %s (stages: %s)", b.Target, df, strings.Join(d.StageNames(), ", "))
					}
					for _, img := range d.Images() {
						if img.Stage == b.Target {
							errs = append(errs, checkService(name, s, img)...)
						}
					}
				}
			}
			if s.HealthCheck == nil || s.HealthCheck.Disable || len(s.HealthCheck.Test) == 0 {
				add(name, "is built from the repository but has no healthcheck")
			}
		}

		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			if _, err := os.Stat(v.Source); err != nil {
				add(name, "mounts host path %s, which does not exist", v.Source)
			}
		}

		for _, port := range s.Ports {
			if port.Published == "" {
				continue // ephemeral host port: cannot collide
			}
			lo, hi, err := portRange(port.Published)
			if err != nil {
				add(name, "published port %q: %v", port.Published, err)
				continue
			}
			proto := port.Protocol
			if proto == "" {
				proto = "tcp"
			}
			for n := lo; n <= hi; n++ {
				key := strconv.Itoa(n) + "/" + proto
				for _, u := range published[key] {
					if u.hostIP == port.HostIP || anyIP(u.hostIP) || anyIP(port.HostIP) {
						add(name, "host port %s is also published by %q", key, u.service)
					}
				}
				published[key] = append(published[key], portUse{name, port.HostIP})
			}
		}

		errs = append(errs, checkEnv(name, s)...)
	}
	errs = append(errs, checkTopics(p)...)
	return errors.Join(errs...)
}

// checkEnv checks the KEIRO_* variables of one service against the allow-lists of the binary
// it runs (its build target when that names a binary, else the service name).
func checkEnv(name string, s types.ServiceConfig) []error {
	binary := name
	if s.Build != nil {
		if _, ok := AllowedEnv[s.Build.Target]; ok {
			binary = s.Build.Target
		}
	}
	allowed, known := AllowedEnv[binary]
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(s.Environment)) {
		switch {
		case !strings.HasPrefix(k, "KEIRO_"):
		case !known:
			errs = append(errs, fmt.Errorf("service %q: sets %s, but it runs no keiro binary (%s)", name, k, strings.Join(slices.Sorted(maps.Keys(AllowedEnv)), ", ")))
		case !slices.Contains(allowed, k):
			errs = append(errs, fmt.Errorf("service %q: %s is not read by %s (known: %s)", name, k, binary, strings.Join(allowed, ", ")))
		}
		if strings.HasPrefix(k, "OTEL_") && known && !slices.Contains(OTelEnv, k) {
			errs = append(errs, fmt.Errorf("service %q: %s is not an OpenTelemetry variable the binaries honour (known: %s)", name, k, strings.Join(OTelEnv, ", ")))
		}
	}
	for _, k := range RequiredEnv[binary] {
		if v, ok := s.Environment[k]; !ok || v == nil || *v == "" {
			errs = append(errs, fmt.Errorf("service %q: %s is required by %s but not set", name, k, binary))
		}
	}
	return errs
}

func anyIP(ip string) bool { return ip == "" || ip == "0.0.0.0" || ip == "::" }

// portRange parses "8080" or "8000-8010".
func portRange(s string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(s, "-")
	if lo, err = strconv.Atoi(a); err != nil {
		return 0, 0, fmt.Errorf("not a port number")
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(b); err != nil || hi < lo {
			return 0, 0, fmt.Errorf("not a port range")
		}
	}
	if lo < 1 || hi > 65535 {
		return 0, 0, fmt.Errorf("outside 1–65535")
	}
	return lo, hi, nil
}
