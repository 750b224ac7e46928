package tracing_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestPrometheusConfig checks that deploy/prometheus/prometheus.yml parses and scrapes the relay
// and the consumer on the port and path their HTTP servers serve /metrics.
func TestPrometheusConfig(t *testing.T) {
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
	raw, err := os.ReadFile("../deploy/prometheus/prometheus.yml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &cfg))
	targets := map[string][]string{}
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName == "prometheus" {
			continue
		}
		require.Equal(t, "/metrics", sc.MetricsPath, "job %s", sc.JobName)
		for _, st := range sc.StaticConfigs {
			targets[sc.JobName] = append(targets[sc.JobName], st.Targets...)
		}
	}
	require.Equal(t, map[string][]string{"relay": {"relay:8080"}, "consumer": {"consumer:8080"}}, targets)
}

// TestGrafanaProvisioning checks that the datasource the dashboard expects (uid prometheus) and
// the dashboard provider exist.
func TestGrafanaProvisioning(t *testing.T) {
	t.Parallel()
	var ds struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			UID, Type, URL string
		} `yaml:"datasources"`
	}
	raw, err := os.ReadFile("../deploy/grafana/provisioning/datasources/prometheus.yml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &ds))
	require.Equal(t, 1, ds.APIVersion)
	require.Len(t, ds.Datasources, 1)
	require.Equal(t, "prometheus", ds.Datasources[0].UID)
	require.Equal(t, "prometheus", ds.Datasources[0].Type)
	require.Equal(t, "http://prometheus:9090", ds.Datasources[0].URL)

	var dp struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	raw, err = os.ReadFile("../deploy/grafana/provisioning/dashboards/keiro.yml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &dp))
	require.Equal(t, 1, dp.APIVersion)
	require.Len(t, dp.Providers, 1)
	require.Equal(t, "file", dp.Providers[0].Type)
	require.Equal(t, "/var/lib/grafana/dashboards", dp.Providers[0].Options.Path)
}
