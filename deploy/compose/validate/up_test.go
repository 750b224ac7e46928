//go:build composetest

package validate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/schema"
)

// orderAvro is the writer schema of the Avro order the test sends through the stack's registry.
const orderAvro = `{"type":"record","name":"OrderSubmitted","namespace":"keiro.compose","fields":[{"name":"orderId","type":"string"},{"name":"quantity","type":"long"}]}`

// TestComposeUp runs the project's docker-compose.yml, unchanged, on images built on this machine
// (deploy/compose/local: docker-compose.local.yml names them, build-images builds them; make
// compose-test does both) and checks what `make demo` checks, through the containers: N orders
// written by the demo-orders container with plain SQL → relay container → Kafka → consumer
// container → billing.orders_received, each exactly once and nothing left in the outbox or the
// inbox; an Avro order whose schema goes through the registry container; the sidecars' spans in
// Jaeger; Prometheus scraping both sidecars with the alert rules loaded. Then `down -v`.
func TestComposeUp(t *testing.T) {
	root, err := filepath.Abs("../../..")
	require.NoError(t, err)
	require.NotEmpty(t, os.Getenv("DOCKER_HOST"), "run through make compose-test (scripts/docker starts the engine)")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// Free host ports for everything the stack publishes, so the test runs beside anything.
	ports := map[string]int{}
	for _, v := range []string{"KEIRO_PG_PORT", "KEIRO_KAFKA_PORT", "KEIRO_SR_PORT", "KEIRO_JAEGER_UI_PORT",
		"KEIRO_OTLP_GRPC_PORT", "KEIRO_OTLP_HTTP_PORT", "KEIRO_PROMETHEUS_PORT", "KEIRO_GRAFANA_PORT",
		"KEIRO_RELAY_PORT", "KEIRO_CONSUMER_PORT"} {
		ports[v] = freePort(t)
	}
	env := os.Environ()
	for k, p := range ports {
		env = append(env, k+"="+strconv.Itoa(p))
	}
	project := "keiro-composetest"
	compose := func(args ...string) (string, error) {
		full := append([]string{"compose", "-p", project, "-f", "docker-compose.yml", "-f", "deploy/compose/local/docker-compose.local.yml"}, args...)
		cmd := exec.Command("docker", full...) // bounded by the test's timeout (make compose-test: 30m)
		cmd.Dir, cmd.Env = root, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := compose(args...)
		require.NoError(t, err, "docker compose %s:\n%s", strings.Join(args, " "), out)
		return out
	}
	_, _ = compose("down", "-v", "--remove-orphans") // a previous run's leftovers
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := compose("logs", "--no-color", "--tail", "40")
			t.Logf("the stack's last log lines:\n%s", out)
		}
		if out, err := compose("down", "-v", "--remove-orphans"); err != nil {
			t.Errorf("docker compose down: %v\n%s", err, out)
		}
	})
	start := time.Now()
	must("up", "-d", "--wait", "--no-build")
	t.Logf("the stack is healthy after %s", time.Since(start).Round(time.Second))

	// The orders context: N orders through keiro.enqueue in the demo-orders container.
	const n = 300
	must("--profile", "demo", "run", "--rm", "-e", "N="+strconv.Itoa(n), "demo-orders")

	// One order in Avro, its schema registered through the stack's registry, enqueued through
	// the published PostgreSQL port as a Go service would.
	pgURL := fmt.Sprintf("postgres://keiro:keiro@127.0.0.1:%d/keiro?sslmode=disable", ports["KEIRO_PG_PORT"])
	conn, err := pgx.Connect(ctx, pgURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: fmt.Sprintf("http://127.0.0.1:%d/apis/ccompat/v7", ports["KEIRO_SR_PORT"])})
	require.NoError(t, err)
	ser, err := schema.NewSerializer(reg, orderAvro, schema.SerializerConfig{AutoRegister: true})
	require.NoError(t, err)
	key := "customer-avro"
	avroOrder := envelope.Event{
		MessageID: "order-avro-1", Source: "ordering", Destination: "billing.orders.v1", Key: &key,
		EventType: "OrderSubmitted", SchemaVersion: 1, OccurredAt: time.Now().UTC().Truncate(time.Microsecond),
	}
	require.NoError(t, ser.Encode(ctx, &avroOrder, map[string]any{"orderId": "order-avro-1", "quantity": int64(3)}))
	ob, err := outbox.NewStore("keiro")
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := ob.EnqueueTx(ctx, tx, avroOrder)
		return err
	}))

	// Every order billed exactly once (orders_received.message_id is a primary key and the
	// handler a plain INSERT, so a second application would have failed the inbox row).
	waitFor(t, 3*time.Minute, "every order in billing.orders_received", func() bool {
		var got int
		return conn.QueryRow(ctx, `SELECT count(*) FROM billing.orders_received`).Scan(&got) == nil && got == n+1
	})
	var pending, notDone, avroQuantity int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM keiro.keiro_outbox WHERE status <> 'sent'`).Scan(&pending))
	require.Zero(t, pending, "every outbox row sent")
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM keiro.keiro_inbox WHERE status <> 'completed'`).Scan(&notDone))
	require.Zero(t, notDone, "every inbox row completed")
	require.NoError(t, conn.QueryRow(ctx, `SELECT (payload->>'quantity')::int FROM billing.orders_received WHERE message_id = 'order-avro-1'`).Scan(&avroQuantity))
	require.Equal(t, 3, avroQuantity, "the Avro order reached the handler as JSON, decoded with the registry's schema")
	// Each customer's orders are on one partition, in the order the transaction enqueued them
	// (the inbox records each message's partition and offset).
	var keysOutOfOrder, keysSplit int
	require.NoError(t, conn.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE prev > seq), count(DISTINCT order_key) FILTER (WHERE prev_partition <> kafka_partition)
FROM (
  SELECT r.order_key, i.kafka_partition, substring(r.payload->>'orderId' from 7)::int AS seq,
         lag(substring(r.payload->>'orderId' from 7)::int) OVER w AS prev,
         lag(i.kafka_partition) OVER w AS prev_partition
  FROM billing.orders_received r JOIN keiro.keiro_inbox i USING (message_id)
  WHERE r.message_id <> 'order-avro-1'
  WINDOW w AS (PARTITION BY r.order_key ORDER BY i.kafka_partition, i.kafka_offset)) s`).Scan(&keysOutOfOrder, &keysSplit))
	require.Zero(t, keysSplit, "each customer's orders on one partition")
	require.Zero(t, keysOutOfOrder, "each customer's orders published and applied in enqueue order")

	// The sidecars' spans in Jaeger.
	jaeger := fmt.Sprintf("http://127.0.0.1:%d", ports["KEIRO_JAEGER_UI_PORT"])
	waitFor(t, 2*time.Minute, "keiro-relay and keiro-consumer in Jaeger's services", func() bool {
		var doc struct{ Data []string }
		if getJSON(ctx, jaeger+"/api/services", &doc) != nil {
			return false
		}
		return contains(doc.Data, "keiro-relay") && contains(doc.Data, "keiro-consumer")
	})

	// Prometheus scrapes both sidecars and has loaded the alert rules.
	prom := fmt.Sprintf("http://127.0.0.1:%d", ports["KEIRO_PROMETHEUS_PORT"])
	waitFor(t, 2*time.Minute, "Prometheus scraping the relay and the consumer", func() bool {
		var doc struct {
			Data struct {
				ActiveTargets []struct {
					Labels map[string]string
					Health string
				}
			}
		}
		if getJSON(ctx, prom+"/api/v1/targets", &doc) != nil {
			return false
		}
		up := map[string]bool{}
		for _, tg := range doc.Data.ActiveTargets {
			if tg.Health == "up" {
				up[tg.Labels["job"]] = true
			}
		}
		return up["keiro-relay"] && up["keiro-consumer"]
	})
	var rules struct {
		Data struct {
			Groups []struct {
				Name  string
				Rules []struct{ Name string }
			}
		}
	}
	require.NoError(t, getJSON(ctx, prom+"/api/v1/rules", &rules))
	nRules := 0
	for _, g := range rules.Data.Groups {
		nRules += len(g.Rules)
	}
	require.Positive(t, nRules, "the alert rules are loaded")
	var published struct {
		Data struct {
			Result []struct{ Value []any }
		}
	}
	waitFor(t, 2*time.Minute, "the relay's published counter in Prometheus", func() bool {
		if getJSON(ctx, prom+"/api/v1/query?query=sum(keiro_outbox_published_total)", &published) != nil || len(published.Data.Result) == 0 {
			return false
		}
		v, _ := published.Data.Result[0].Value[1].(string)
		f, err := strconv.ParseFloat(v, 64)
		return err == nil && f >= n+1
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor polls cond until it holds or timeout passes (the containers' progress has no hook
// the test can wait on).
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func getJSON(ctx context.Context, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return json.Unmarshal(b, out)
}

func contains(xs []string, x string) bool {
	for _, s := range xs {
		if s == x {
			return true
		}
	}
	return false
}
