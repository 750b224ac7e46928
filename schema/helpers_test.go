package schema_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

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

func srSchema(text string) sr.Schema { return sr.Schema{Schema: text, Type: sr.TypeAvro} }
