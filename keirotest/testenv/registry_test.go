package testenv_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// Each test gets a namespace of its own on the one registry of the process.
func TestSchemaRegistryNamespaces(t *testing.T) {
	t.Parallel()
	a, b := testenv.NewSchemaRegistry(t), testenv.NewSchemaRegistry(t)
	if a.URL != b.URL || !strings.HasPrefix(a.URL, "http://127.0.0.1:") || !strings.HasSuffix(a.URL, "/apis/ccompat/v7") {
		t.Fatalf("registries at %s and %s; want one Apicurio on loopback", a.URL, b.URL)
	}
	if a.Name("orders-value") == b.Name("orders-value") || !strings.HasSuffix(a.Name("orders-value"), "-orders-value") {
		t.Fatalf("namespaces %q and %q", a.Name("orders-value"), b.Name("orders-value"))
	}
	// The rule is set on the registry: it answers it back.
	subject := a.Name("orders-value")
	a.SetCompatibility(t, subject, testenv.CompatibilityFull)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	resp, err := client.Get(a.URL + "/config/" + subject)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	body := string(raw)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, testenv.CompatibilityFull) {
		t.Fatalf("GET /config/%s: %s %s", subject, resp.Status, body)
	}
}

// A rule the registry refuses fails the test with the registry's answer.
func TestSetCompatibilityRefusedFailsTheTest(t *testing.T) {
	t.Parallel()
	reg := testenv.NewSchemaRegistry(t)
	msg := record(t, func(tb testing.TB) { reg.SetCompatibility(tb, reg.Name("x-value"), "SIDEWAYS") })
	if !strings.Contains(msg, "PUT /config/"+reg.Name("x-value")) || !strings.Contains(msg, "schema registry") {
		t.Fatalf("message: %q", msg)
	}
}

// KEIRO_TEST_SCHEMA_REGISTRY_URL points the kit at a registry of the user's, trailing slash and
// all; nothing is started for it.
func TestSchemaRegistryFromTheEnvironment(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"compatibility":"BACKWARD"}`))
	}))
	defer srv.Close()
	t.Setenv(testenv.SchemaRegistryURLEnv, srv.URL+"/ccompat/")
	reg := testenv.NewSchemaRegistry(t)
	if reg.URL != srv.URL+"/ccompat" {
		t.Fatalf("URL = %s, want %s/ccompat", reg.URL, srv.URL)
	}
	reg.SetCompatibility(t, "s-value", testenv.CompatibilityBackward)
	if len(got) != 1 || got[0] != "PUT /ccompat/config/s-value" {
		t.Fatalf("requests: %v", got)
	}
}
