package schemacli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/keirotest/testenv"

	"github.com/keiro-go/keiro/cmd/internal/schemacli"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const v1 = `{"type":"record","name":"OrderPlaced","namespace":"com.acme","fields":[{"name":"id","type":"string"}]}`

type result struct {
	code           int
	stdout, stderr string
}

func run(args ...string) result {
	var out, errb bytes.Buffer
	code := schemacli.Run(context.Background(), args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

func schemaFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "order.avsc")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func newFake(t *testing.T, opts ...srfake.Option) (*srfake.Registry, string) {
	t.Helper()
	reg := srfake.NewRegistry(opts...)
	srv := httptest.NewServer(reg.Handler())
	t.Cleanup(srv.Close)
	return reg, srv.URL
}

// subjectVersion asks the registry for version v of subject: its id, or false when it has none.
func subjectVersion(t *testing.T, reg *testenv.SchemaRegistry, subject string, v int) (int, bool) {
	t.Helper()
	client := &http.Client{}
	defer client.CloseIdleConnections()
	resp, err := client.Get(fmt.Sprintf("%s/subjects/%s/versions/%d", reg.URL, subject, v))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		ID int `json:"id"`
	}
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	return got.ID, true
}

func TestRegister(t *testing.T) {
	t.Parallel()
	reg := testenv.NewSchemaRegistry(t)
	subject := reg.Name("orders.v1-value")
	file := schemaFile(t, v1)
	r := run("register", subject, file, "--registry-url", reg.URL)
	if r.code != 0 {
		t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	id, ok := subjectVersion(t, reg, subject, 1)
	if !ok || !strings.Contains(r.stdout, fmt.Sprintf("id %d, version 1", id)) {
		t.Fatalf("registry has id %d (%v); printed %q", id, ok, r.stdout)
	}
	// Again: idempotent, same id and version.
	if r2 := run("schema", "register", "--registry-url="+reg.URL, subject, file); r2.code != 0 || r2.stdout != r.stdout {
		t.Fatalf("second register: exit %d %q, want %q", r2.code, r2.stdout, r.stdout)
	}
}

func TestRegisterFromEnvWithAuth(t *testing.T) {
	const password = "pa55-w0rd-xyz"
	fake, url := newFake(t, srfake.WithAuth("Basic "+base64.StdEncoding.EncodeToString([]byte("ops:"+password))))
	t.Setenv("KEIRO_SCHEMA_REGISTRY_URL", url)
	t.Setenv("KEIRO_SCHEMA_REGISTRY_USER", "ops")
	t.Setenv("KEIRO_SCHEMA_REGISTRY_PASSWORD", password)
	if r := run("register", "orders.v1-value", schemaFile(t, v1)); r.code != 0 {
		t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if !fake.SubjectExists("orders.v1-value") {
		t.Fatal("not registered")
	}
	t.Setenv("KEIRO_SCHEMA_REGISTRY_PASSWORD", "wrong-"+password)
	r := run("register", "orders.v1-value", schemaFile(t, v1))
	if r.code != 2 || !strings.Contains(r.stderr, "check the registry user and password") ||
		strings.Contains(r.stderr, "registry is up") || strings.Contains(r.stderr+r.stdout, password) {
		t.Fatalf("wrong password: exit %d, stderr %q", r.code, r.stderr)
	}
	if h := run("register", "--help"); strings.Contains(h.stdout+h.stderr, password) || !strings.Contains(h.stdout, "KEIRO_SCHEMA_REGISTRY_PASSWORD") {
		t.Fatalf("help leaks the password or lacks the env var:\n%s", h.stdout)
	}
}

// v2Incompatible adds a field without a default: under BACKWARD, a reader of it cannot read v1
// data.
const v2Incompatible = `{"type":"record","name":"OrderPlaced","namespace":"com.acme","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`

func TestCheck(t *testing.T) {
	t.Parallel()
	reg := testenv.NewSchemaRegistry(t)
	subject := reg.Name("orders.v1-value")
	file := schemaFile(t, v1)

	// A subject without versions: nothing to be incompatible with (a registry answers that
	// with a verdict or with 40401; both read as compatible).
	r := run("check", subject, file, "--registry-url", reg.URL)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "compatible") {
		t.Fatalf("new subject: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("register", subject, file, "--registry-url", reg.URL); r.code != 0 {
		t.Fatalf("register: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	reg.SetCompatibility(t, subject, testenv.CompatibilityBackward)
	if r := run("check", subject, file, "--registry-url", reg.URL); r.code != 0 || !strings.HasPrefix(r.stdout, "compatible") {
		t.Fatalf("compatible: exit %d %q %q", r.code, r.stdout, r.stderr)
	}

	// The registry says no: exit 1, the verdict on stdout.
	bad := schemaFile(t, v2Incompatible)
	r = run("check", subject, bad, "--registry-url", reg.URL)
	if r.code != schemacli.ExitIncompatible || !strings.HasPrefix(r.stdout, "incompatible: "+bad+" breaks the compatibility rule of subject "+subject) {
		t.Fatalf("incompatible: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	// Registering it anyway is refused (409) with what to do next, and nothing is registered.
	r = run("register", subject, bad, "--registry-url", reg.URL)
	if r.code != 2 || !strings.Contains(r.stderr, "schema incompatible with subject") || !strings.Contains(r.stderr, "relay schema check") {
		t.Fatalf("register incompatible: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if _, ok := subjectVersion(t, reg, subject, 2); ok {
		t.Fatal("the refused schema was registered as version 2")
	}
}

// A registry that answers 40401 for a subject without versions (as some Confluent releases do)
// has nothing to be incompatible with. Apicurio answers a verdict instead, so srfake plays it.
func TestCheckNewSubjectNotFound(t *testing.T) {
	fake, url := newFake(t)
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasPrefix(r.URL.Path, "/compatibility/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error_code":40401,"message":"Subject 'orders.v1-value' not found."}`)
			return true
		}
		return false
	})
	r := run("check", "orders.v1-value", schemaFile(t, v1), "--registry-url", url)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "compatible") || !strings.Contains(r.stdout, "no version yet") {
		t.Fatalf("new subject: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// A registry that answers a verdict with its reasons (verbose=true, as Confluent's registry
// does): the reasons are printed. Apicurio answers none, so this one is played by srfake.
func TestCheckPrintsTheRegistrysReasons(t *testing.T) {
	fake, url := newFake(t)
	var sawVerbose bool
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/compatibility/subjects/orders.v1-value/versions/latest") {
			return false
		}
		sawVerbose = r.URL.Query().Get("verbose") == "true"
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"is_compatible":false,"messages":["READER_FIELD_MISSING_DEFAULT_VALUE: qty"]}`)
		return true
	})
	r := run("check", "orders.v1-value", schemaFile(t, v1), "--registry-url", url)
	if r.code != 1 || !strings.Contains(r.stdout, "incompatible") || !strings.Contains(r.stdout, "READER_FIELD_MISSING_DEFAULT_VALUE: qty") || !sawVerbose {
		t.Fatalf("incompatible: exit %d %q %q (verbose asked: %v)", r.code, r.stdout, r.stderr, sawVerbose)
	}
}

func TestErrors(t *testing.T) {
	url := testenv.NewSchemaRegistry(t).URL
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close()
	good := schemaFile(t, v1)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"no registry", []string{"register", "s", good}, []string{"--registry-url: is required"}},
		{"all problems at once", []string{"check", "s", good, "--registry-user=u", "--registry-cert-file=c", "--timeout=-1s"},
			[]string{"--registry-url", "--registry-user", "--registry-cert-file", "--timeout"}},
		{"missing args", []string{"register", "--registry-url", url}, []string{"expected"}},
		{"unknown command", []string{"delete", "s", "--registry-url", url}, []string{"unexpected argument delete"}},
		{"missing file", []string{"register", "s", filepath.Join(t.TempDir(), "nope.avsc"), "--registry-url", url}, []string{"read schema file"}},
		{"bad schema", []string{"register", "s", schemaFile(t, `{"type":"record"}`), "--registry-url", url}, []string{"invalid Avro schema", "fix the .avsc"}},
		{"bad schema check", []string{"check", "s", schemaFile(t, `{"type":`), "--registry-url", url}, []string{"invalid Avro schema"}},
		{"registry down", []string{"register", "s", good, "--registry-url", downURL, "--timeout=2s"}, []string{"unavailable", "check --registry-url"}},
		{"bad URL", []string{"register", "s", good, "--registry-url", "localhost:8081"}, []string{"not an http(s) URL"}},
	}
	for _, tc := range cases {
		r := run(tc.args...)
		if r.code != 2 {
			t.Errorf("%s: exit %d, want 2 (stdout %q stderr %q)", tc.name, r.code, r.stdout, r.stderr)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: stderr %q does not say %q", tc.name, r.stderr, w)
			}
		}
	}
	if r := run(); r.code != 0 || !strings.Contains(r.stdout, "register") || !strings.Contains(r.stdout, "check") {
		t.Fatalf("no args: exit %d, help %q", r.code, r.stdout)
	}
}
