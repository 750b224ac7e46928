package schema_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/schema"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// fakeRegistry serves srfake over HTTP and counts the requests that reach it.
type fakeRegistry struct {
	*srfake.Registry
	srv *httptest.Server

	mu   sync.Mutex
	reqs []string // "METHOD /path"
}

func newFakeRegistry(t testing.TB, opts ...srfake.Option) *fakeRegistry {
	t.Helper()
	f := &fakeRegistry{Registry: srfake.NewRegistry(opts...)}
	h := f.Handler()
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.reqs = append(f.reqs, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRegistry) URL() string { return f.srv.URL }

// requests returns how many requests reached the registry whose "METHOD /path" starts with
// prefix ("" counts all).
func (f *fakeRegistry) requests(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.reqs {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

func (f *fakeRegistry) register(t testing.TB, subject, text string) int {
	t.Helper()
	id, _, err := f.RegisterSchema(subject, sr.Schema{Schema: text, Type: sr.TypeAvro})
	if err != nil {
		t.Fatalf("seed subject %s: %v", subject, err)
	}
	return id
}

// newRegistry returns a client for url with fast retries, closed at the end of the test.
func newRegistry(t testing.TB, url string, mutate ...func(*schema.RegistryConfig)) *schema.Registry {
	t.Helper()
	cfg := schema.RegistryConfig{URL: url, MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
		RequestTimeout: 5 * time.Second}
	for _, m := range mutate {
		m(&cfg)
	}
	reg, err := schema.NewRegistry(cfg)
	if err != nil {
		t.Fatalf("NewRegistry: %v", err)
	}
	t.Cleanup(reg.Close)
	return reg
}

const orderSchema = `{
  "type": "record", "name": "OrderPlaced", "namespace": "com.acme.orders",
  "fields": [
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "lines", "type": {"type": "array", "items": {
      "type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"},
        {"name": "qty", "type": "int"}
      ]}}},
    {"name": "tags", "type": {"type": "map", "values": "string"}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "discount", "type": ["null", "double", "string"], "default": null},
    {"name": "paid", "type": "boolean"},
    {"name": "weight", "type": "float"}
  ]
}`

// realRegistry is a namespace on the real schema registry (Apicurio Registry's Confluent API,
// testenv.NewSchemaRegistry) behind a proxy of the test's own that counts the requests reaching
// it, so that tests of the client's cache run against a real registry.
type realRegistry struct {
	*testenv.SchemaRegistry
	srv *httptest.Server

	mu   sync.Mutex
	reqs []string // "METHOD /path", the path as the client sent it
}

func newRealRegistry(t testing.TB) *realRegistry {
	t.Helper()
	r := &realRegistry{SchemaRegistry: testenv.NewSchemaRegistry(t)}
	target, err := url.Parse(r.SchemaRegistry.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	transport := &http.Transport{}
	proxy.Transport = transport
	t.Cleanup(transport.CloseIdleConnections)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.reqs = append(r.reqs, req.Method+" "+req.URL.Path)
		r.mu.Unlock()
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// URL is the counting proxy's address.
func (r *realRegistry) URL() string { return r.srv.URL }

// requests returns how many requests reached the registry whose "METHOD /path" starts with
// prefix ("" counts all).
func (r *realRegistry) requests(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, q := range r.reqs {
		if strings.HasPrefix(q, prefix) {
			n++
		}
	}
	return n
}

// call sends one request straight to the registry (not counted) and decodes its JSON answer
// into out; it returns the HTTP status.
func (r *realRegistry) call(t testing.TB, method, path string, in, out any) int {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, r.SchemaRegistry.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	client := &http.Client{}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s answered %s: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

// register registers an Avro schema under subject, straight on the registry, and returns its id.
func (r *realRegistry) register(t testing.TB, subject, text string) int {
	t.Helper()
	var out struct {
		ID int `json:"id"`
	}
	if st := r.call(t, http.MethodPost, "/subjects/"+url.PathEscape(subject)+"/versions", map[string]string{"schema": text}, &out); st != http.StatusOK {
		t.Fatalf("seed subject %s: HTTP %d", subject, st)
	}
	return out.ID
}

// version returns version v of subject as the registry has it, and whether it has it.
func (r *realRegistry) version(t testing.TB, subject string, v int) (registered, bool) {
	t.Helper()
	var out registered
	st := r.call(t, http.MethodGet, "/subjects/"+url.PathEscape(subject)+"/versions/"+strconv.Itoa(v), nil, &out)
	return out, st == http.StatusOK
}

// registered is a subject's version as the registry answers it.
type registered struct {
	Subject string `json:"subject"`
	Version int    `json:"version"`
	ID      int    `json:"id"`
	Schema  string `json:"schema"`
}

// subjectExists reports whether the registry lists subject.
func (r *realRegistry) subjectExists(t testing.TB, subject string) bool {
	t.Helper()
	var subjects []string
	if st := r.call(t, http.MethodGet, "/subjects", nil, &subjects); st != http.StatusOK {
		t.Fatalf("list subjects: HTTP %d", st)
	}
	return slices.Contains(subjects, subject)
}
