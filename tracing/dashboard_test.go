package tracing_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/keiro-go/keiro/tracing"
	"github.com/keiro-go/keiro/tracing/otelsetup"
)

const dashboardPath = "../deploy/grafana/dashboards/keiro.json"

// grafanaDashboard is the part of Grafana's dashboard JSON model the test checks.
type grafanaDashboard struct {
	Title         string          `json:"title"`
	UID           string          `json:"uid"`
	SchemaVersion int             `json:"schemaVersion"`
	Panels        []grafanaPanel  `json:"panels"`
	Templating    json.RawMessage `json:"templating"`
}

type grafanaPanel struct {
	ID         int                 `json:"id"`
	Type       string              `json:"type"`
	Title      string              `json:"title"`
	Datasource *grafanaDS          `json:"datasource"`
	GridPos    *struct{ H, W int } `json:"gridPos"`
	Targets    []struct {
		RefID      string     `json:"refId"`
		Expr       string     `json:"expr"`
		Datasource *grafanaDS `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDS struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// TestPrometheusNames pins the exporter's translation of OpenTelemetry names (v0.69.0, underscore
// escaping with suffixes), which the dashboard and docs/observability.md rely on.
func TestPrometheusNames(t *testing.T) {
	t.Parallel()
	families := scrapeVocabulary(t)
	for otel, prom := range map[string]string{
		tracing.MetricOutboxPublished:      "keiro_outbox_published_total",
		tracing.MetricOutboxEnqueued:       "keiro_outbox_enqueued_total",
		tracing.MetricOutboxBacklog:        "keiro_outbox_backlog",
		tracing.MetricOutboxOldestPending:  "keiro_outbox_oldest_pending_age_seconds",
		tracing.MetricOutboxPublishLatency: "keiro_outbox_publish_latency_seconds_bucket",
		tracing.MetricOutboxBatchSize:      "keiro_outbox_batch_size_bucket",
		tracing.MetricInboxHandlerDuration: "keiro_inbox_handler_duration_seconds_count",
		tracing.MetricConsumerLag:          "keiro_consumer_lag",
	} {
		require.Contains(t, families, prom, "translation of %s", otel)
	}
	// Every vocabulary metric shows up under some keiro_ name.
	require.GreaterOrEqual(t, countPrefix(families, "keiro_"), len(tracing.MetricNames))
}

// TestDashboard loads the Grafana dashboard, checks its structure, and checks that every metric
// its PromQL uses is produced by the vocabulary through the Prometheus exporter.
func TestDashboard(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	var d grafanaDashboard
	require.NoError(t, json.Unmarshal(raw, &d), "dashboard is JSON")
	require.NotEmpty(t, d.Title)
	require.NotEmpty(t, d.UID)
	require.GreaterOrEqual(t, d.SchemaVersion, 36, "schemaVersion of a current Grafana")
	require.Contains(t, string(d.Templating), `"datasource"`, "a datasource variable")

	var exprs []string
	ids := map[int]bool{}
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			require.NotZero(t, p.ID, "panel %q has an id", p.Title)
			require.False(t, ids[p.ID], "panel id %d is unique", p.ID)
			ids[p.ID] = true
			require.NotNil(t, p.GridPos, "panel %q has a gridPos", p.Title)
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			require.NotEmpty(t, p.Title)
			require.NotNil(t, p.Datasource, "panel %q has a datasource", p.Title)
			require.Equal(t, "prometheus", p.Datasource.Type, "panel %q", p.Title)
			require.NotEmpty(t, p.Targets, "panel %q has targets", p.Title)
			for _, tg := range p.Targets {
				require.NotEmpty(t, tg.RefID, "panel %q", p.Title)
				require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
				require.Equal(t, strings.Count(tg.Expr, "("), strings.Count(tg.Expr, ")"), "balanced parentheses in %q", tg.Expr)
				// Gauges are told apart by their labels (destination, group, consumer): an
				// aggregation over everything would hide which bounded context is stuck.
				require.NotRegexp(t, `\b(max|min|avg|sum)\s*\(\s*(keiro|messaging)_`, tg.Expr, "panel %q aggregates without by(...)", p.Title)
				exprs = append(exprs, tg.Expr)
			}
		}
	}
	walk(d.Panels)

	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range promqlMetrics(e) {
			used[m] = true
		}
	}
	families := scrapeVocabulary(t)
	for m := range used {
		require.Contains(t, families, m, "dashboard metric %s is produced (check the exporter's name translation)", m)
	}

	// The dashboard shows every metric of the vocabulary.
	for _, v := range tracing.MetricNames {
		prefix := strings.ReplaceAll(v.Name, ".", "_")
		shown := false
		for m := range used {
			shown = shown || strings.HasPrefix(m, prefix)
		}
		require.True(t, shown, "dashboard shows %s", v.Name)
	}
}

func TestPromqlMetrics(t *testing.T) {
	t.Parallel()
	got := promqlMetrics(`histogram_quantile(0.99, sum by (le, destination) (rate(a_b_bucket{job=~"$job", x="y z"}[$__rate_interval]))) / on(job) group_left sum without (instance) (c:d) > bool 0.5e3 and time() - e offset 5m`)
	slices.Sort(got)
	require.Equal(t, []string{"a_b_bucket", "c:d", "e"}, got)
}

var (
	promqlStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlDurations = regexp.MustCompile(`\boffset\s+\S+`)
	promqlIdent     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promqlFuncCall  = regexp.MustCompile(`^\s*\(`)
	promqlKeywords  = map[string]bool{
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
		"sum": true, "min": true, "max": true, "avg": true, "count": true, "topk": true, "bottomk": true,
		"quantile": true, "stddev": true, "stdvar": true, "count_values": true, "group": true,
	}
)

// promqlMetrics returns the metric names a PromQL expression selects: identifiers that are not
// keywords, aggregation operators or function calls, outside strings, label matchers, ranges
// and grouping clauses.
func promqlMetrics(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, " ")
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRanges.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	s = promqlDurations.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range promqlIdent.FindAllStringIndex(s, -1) {
		id := s[loc[0]:loc[1]]
		if promqlKeywords[strings.ToLower(id)] || promqlFuncCall.MatchString(s[loc[1]:]) {
			continue
		}
		if loc[0] > 0 && (s[loc[0]-1] == '.' || (s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9')) {
			continue // part of a number such as 0.5e3
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// scrapeVocabulary records one data point on every instrument of tracing.MetricNames through
// otelsetup.Setup's Prometheus exporter and returns the scraped series names (without labels).
func scrapeVocabulary(t *testing.T) map[string]bool {
	t.Helper()
	tel, err := otelsetup.Setup(context.Background(), otelsetup.Options{NoGlobals: true, Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	recordVocabulary(t, tel.MeterProvider())

	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	families := map[string]bool{}
	for line := range strings.SplitSeq(rec.Body.String(), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		families[name] = true
	}
	return families
}

// recordVocabulary creates every instrument of the vocabulary on mp, with its unit, and records
// one data point carrying each of its attributes.
func recordVocabulary(t *testing.T, mp metric.MeterProvider) {
	t.Helper()
	ctx := context.Background()
	m := tracing.Meter(mp)
	for _, v := range tracing.MetricNames {
		var kvs []attribute.KeyValue
		for _, k := range v.Attributes {
			kvs = append(kvs, k.String("x"))
		}
		attrs := metric.WithAttributes(kvs...)
		opts := []metric.Float64HistogramOption{metric.WithUnit(v.Unit), metric.WithDescription(v.Description)}
		switch v.Kind {
		case tracing.Counter:
			c, err := m.Int64Counter(v.Name, metric.WithUnit(v.Unit), metric.WithDescription(v.Description))
			require.NoError(t, err)
			c.Add(ctx, 1, attrs)
		case tracing.Gauge:
			g, err := m.Float64Gauge(v.Name, metric.WithUnit(v.Unit), metric.WithDescription(v.Description))
			require.NoError(t, err)
			g.Record(ctx, 1, attrs)
		case tracing.Histogram:
			h, err := m.Float64Histogram(v.Name, opts...)
			require.NoError(t, err)
			h.Record(ctx, 0.5, attrs)
		default:
			t.Fatalf("metric %s has no kind", v.Name)
		}
	}
}

func countPrefix(m map[string]bool, prefix string) int {
	n := 0
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}
