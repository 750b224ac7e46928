package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv/internal/apicurio"
)

// SchemaRegistryURLEnv names the environment variable that points the tests at a running
// Confluent-compatible schema registry (its API's base URL) instead of the one the kit starts.
const SchemaRegistryURLEnv = "KEIRO_TEST_SCHEMA_REGISTRY_URL"

// SchemaRegistry is the schema registry one test uses: a namespace on a real registry shared by
// the tests of the process (Apicurio Registry through its Confluent-compatible API, or the one
// named by KEIRO_TEST_SCHEMA_REGISTRY_URL). Subject names are global on a registry, so a test
// names its subjects, and the topics its subjects are derived from, through Name.
type SchemaRegistry struct {
	// URL is the base URL of the registry's Confluent API, for schema.RegistryConfig.URL or a
	// --schema-registry flag.
	URL string

	ns string
}

// NewSchemaRegistry returns a namespace on the real schema registry: the one named by
// KEIRO_TEST_SCHEMA_REGISTRY_URL, else an Apicurio Registry the kit starts once per test process
// (about 3–8 s; the first start on a machine downloads it through Maven). It fails the test,
// never skips it, when the registry cannot be started.
func NewSchemaRegistry(t testing.TB) *SchemaRegistry {
	t.Helper()
	u, err := RealSchemaRegistryURL()
	if err != nil {
		t.Fatalf("keirotest: %v", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &SchemaRegistry{URL: u, ns: "s" + hex.EncodeToString(b[:]) + "-"}
}

// Name returns name behind the test's namespace prefix: use it for every subject the test
// registers and for every topic whose subjects (<topic>-value, <topic>-<record>) it registers
// through a serializer. On a real Kafka, Kafka.Topic names are already the test's own.
func (r *SchemaRegistry) Name(name string) string { return r.ns + name }

// Compatibility levels of SetCompatibility (Confluent's names).
const (
	CompatibilityNone     = "NONE"
	CompatibilityBackward = "BACKWARD"
	CompatibilityForward  = "FORWARD"
	CompatibilityFull     = "FULL"
)

// SetCompatibility sets subject's compatibility rule (PUT /config/{subject}). A registry's
// default differs by product (Confluent: BACKWARD; Apicurio: none), so a test that relies on a
// refusal sets the rule it means.
func (r *SchemaRegistry) SetCompatibility(t testing.TB, subject, level string) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"compatibility": level})
	r.do(t, http.MethodPut, "/config/"+url.PathEscape(subject), body)
}

// do sends one request to the registry's Confluent API and fails the test unless it answers 2xx.
func (r *SchemaRegistry) do(t testing.TB, method, path string, body []byte) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, r.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatalf("keirotest: %s %s: %v", method, path, err)
	}
	req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	client := &http.Client{}
	defer client.CloseIdleConnections() // no connection outlives the call (goleak)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("keirotest: schema registry %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("keirotest: schema registry %s %s: %s: %s", method, path, resp.Status, out)
	}
	return out
}

// sharedRegistry is the process's real schema registry.
var sharedRegistry struct {
	once sync.Once
	url  string
	err  error
	reg  *apicurio.Registry
}

// RealSchemaRegistryURL returns the base URL of the Confluent API of the real schema registry
// the kit's tests use: KEIRO_TEST_SCHEMA_REGISTRY_URL when set, else that of an Apicurio
// Registry started (once per process, and stopped with it) from Maven artifacts: release
// SchemaRegistryVersion on a Java 21 or newer, else the release that runs on Java 17.
func RealSchemaRegistryURL() (string, error) {
	if env := strings.TrimSpace(os.Getenv(SchemaRegistryURLEnv)); env != "" {
		return strings.TrimRight(env, "/"), nil
	}
	sharedRegistry.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		reg, err := apicurio.Start(ctx, apicurio.Config{})
		if err != nil {
			sharedRegistry.err = fmt.Errorf("start the schema registry (or set %s=http://host:port/apis/ccompat/v7): %w",
				SchemaRegistryURLEnv, err)
			return
		}
		sharedRegistry.reg, sharedRegistry.url = reg, reg.URL
	})
	if sharedRegistry.err != nil {
		return "", sharedRegistry.err
	}
	if sharedRegistry.url == "" {
		return "", errors.New("the schema registry has no address")
	}
	return sharedRegistry.url, nil
}

// SchemaRegistryVersion is the Apicurio Registry release the kit starts where a Java 21 or
// newer is installed; on Java 17 alone it starts SchemaRegistryLegacyVersion.
const SchemaRegistryVersion = apicurio.Version

// SchemaRegistryLegacyVersion is the Apicurio Registry release the kit starts on Java 17.
const SchemaRegistryLegacyVersion = apicurio.LegacyVersion

// StopSchemaRegistry stops the schema registry the kit started for this process, if any; later
// registry tests of the process fail. Run calls it.
func StopSchemaRegistry() {
	sharedRegistry.once.Do(func() { sharedRegistry.err = errors.New("the schema registry was stopped") })
	if sharedRegistry.reg != nil {
		sharedRegistry.reg.Close()
	}
}
