package tracing_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The compose stack (docker-compose.yml, deploy/compose/, owned by the compose files) mounts
// deploy/grafana/dashboards into Grafana and scrapes the binaries with its own Prometheus
// configuration. These tests check that the two halves fit: the dashboard is where the
// provisioning looks, its default datasource uid exists, and /metrics of both binaries is
// scraped.

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, v), path)
}

// TestComposePrometheusScrapesBinaries checks that Prometheus scrapes the relay and the
// consumer on the port and path their HTTP servers serve /metrics.
func TestComposePrometheusScrapesBinaries(t *testing.T) {
	t.Parallel()
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "../deploy/compose/prometheus/prometheus.yml", &cfg)
	var targets []string
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				if tg == "relay:9464" || tg == "consumer:9465" {
					require.Contains(t, []string{"", "/metrics"}, sc.MetricsPath, "job %s", sc.JobName)
				}
				targets = append(targets, tg)
			}
		}
	}
	// The images listen on the ports they expose (Dockerfile, deploy/compose/validate).
	require.Contains(t, targets, "relay:9464")
	require.Contains(t, targets, "consumer:9465")
}

// TestComposeGrafanaLoadsDashboard checks that the provisioned dashboard provider reads the
// directory compose mounts deploy/grafana/dashboards at, and that the datasource uid the
// dashboard defaults to is provisioned.
func TestComposeGrafanaLoadsDashboard(t *testing.T) {
	t.Parallel()
	var compose struct {
		Services map[string]struct {
			Volumes []string `yaml:"volumes"`
		} `yaml:"services"`
	}
	readYAML(t, "../docker-compose.yml", &compose)
	grafana, ok := compose.Services["grafana"]
	require.True(t, ok, "compose has a grafana service")
	var dashDir, provDir string
	for _, v := range grafana.Volumes {
		parts := strings.Split(v, ":")
		require.GreaterOrEqual(t, len(parts), 2, v)
		switch {
		case strings.TrimSuffix(parts[0], "/") == "./deploy/grafana/dashboards":
			dashDir = parts[1]
		case parts[1] == "/etc/grafana/provisioning":
			provDir = strings.TrimPrefix(parts[0], "./")
		}
	}
	require.NotEmpty(t, dashDir, "grafana mounts deploy/grafana/dashboards")
	require.NotEmpty(t, provDir, "grafana mounts a provisioning directory")

	var dp struct {
		Providers []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	entries, err := os.ReadDir("../" + provDir + "/dashboards")
	require.NoError(t, err)
	var paths []string
	for _, e := range entries {
		readYAML(t, "../"+provDir+"/dashboards/"+e.Name(), &dp)
		for _, p := range dp.Providers {
			paths = append(paths, strings.TrimSuffix(p.Options.Path, "/"))
		}
	}
	require.True(t, slices.Contains(paths, strings.TrimSuffix(dashDir, "/")), "a dashboard provider reads %s; have %v", dashDir, paths)

	var ds struct {
		Datasources []struct{ UID, Type string } `yaml:"datasources"`
	}
	entries, err = os.ReadDir("../" + provDir + "/datasources")
	require.NoError(t, err)
	found := false
	for _, e := range entries {
		readYAML(t, "../"+provDir+"/datasources/"+e.Name(), &ds)
		for _, d := range ds.Datasources {
			found = found || (d.UID == "prometheus" && d.Type == "prometheus")
		}
	}
	require.True(t, found, "a prometheus datasource with uid prometheus (the dashboard's default) is provisioned")
}
