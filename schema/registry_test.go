package schema_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/schema"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

func sampleOrder() map[string]any {
	return orderValue(map[string]any{"string": "x"}, nil, []any{map[string]any{"sku": "A", "qty": int32(1)}},
		map[string]any{"a": "b"}, big.NewRat(995, 100))
}

// Steady state makes no HTTP request: the first encode looks the schema up once, the first
// decode fetches the id once, and everything after is served from the cache.
func TestCacheSteadyStateMakesNoRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	topic := real.Name("orders.v1")
	real.register(t, topic+"-value", orderSchema)
	reg := newRegistry(t, real.URL())
	ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	producerSideReg := newRegistry(t, real.URL()) // a consumer process has its own cache
	de, err := schema.NewDeserializer(producerSideReg, schema.DeserializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	encodeDecode := func() {
		t.Helper()
		ev := envelope.Event{Destination: topic}
		if err := ser.Encode(ctx, &ev, sampleOrder()); err != nil {
			t.Fatal(err)
		}
		if _, _, err := de.Decode(ctx, ev.Payload); err != nil {
			t.Fatal(err)
		}
		if _, err := de.DecodeJSON(ctx, ev.Payload); err != nil {
			t.Fatal(err)
		}
	}
	encodeDecode()
	if got := real.requests("POST /subjects/" + topic + "-value"); got != 1 {
		t.Fatalf("first encode made %d lookups, want 1", got)
	}
	if got := real.requests("GET /schemas/ids/"); got != 1 {
		t.Fatalf("first decode made %d id fetches, want 1", got)
	}
	warm := real.requests("")
	for range 200 {
		encodeDecode()
	}
	if got := real.requests(""); got != warm {
		t.Fatalf("steady state made %d HTTP requests, want 0", got-warm)
	}
}

func TestLookupOnlyMissingSubjectNamesIt(t *testing.T) {
	t.Parallel()
	real := newRealRegistry(t)
	real.register(t, real.Name("orders.v1-value"), `{"type":"record","name":"Other","fields":[{"name":"a","type":"int"}]}`)
	reg := newRegistry(t, real.URL())
	ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{real.Name("orders.v1"), real.Name("never-registered")} {
		ev := envelope.Event{Destination: topic}
		err := ser.Encode(context.Background(), &ev, sampleOrder())
		if !errors.Is(err, schema.ErrSubjectNotFound) || schema.IsRetryable(err) {
			t.Fatalf("%s: err = %v, want a permanent ErrSubjectNotFound", topic, err)
		}
		for _, want := range []string{"subject " + topic + "-value has no schema matching com.acme.orders.OrderPlaced",
			"relay schema register", "auto-register"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", topic, err, want)
			}
		}
		if ev.Payload != nil || ev.SchemaRef != nil {
			t.Fatalf("failed Encode touched the event")
		}
	}
	if real.subjectExists(t, real.Name("never-registered-value")) {
		t.Fatal("lookup-only mode registered a subject")
	}
}

func TestAutoRegister(t *testing.T) {
	t.Parallel()
	real := newRealRegistry(t)
	reg := newRegistry(t, real.URL())
	ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{AutoRegister: true,
		SubjectStrategy: schema.TopicRecordNameStrategy})
	if err != nil {
		t.Fatal(err)
	}
	ev := envelope.Event{Destination: real.Name("orders.v1")}
	if err := ser.Encode(context.Background(), &ev, sampleOrder()); err != nil {
		t.Fatal(err)
	}
	got, ok := real.version(t, real.Name("orders.v1-com.acme.orders.OrderPlaced"), 1)
	if !ok || int64(got.ID) != *ev.SchemaRef.SchemaID || *ev.SchemaRef.Version != 1 {
		t.Fatalf("auto-register: registry has %+v (found %v), event says %+v", got, ok, ev.SchemaRef)
	}
}

// A registry outage never loses a message: cached schemas keep working, uncached ones fail
// with a retryable error that is not a "malformed payload" (so the consumer retries instead of
// dead-lettering).
func TestRegistryDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fake := newFakeRegistry(t)
	fake.register(t, "orders.v1-value", orderSchema)
	otherID := fake.register(t, "other-value", `{"type":"record","name":"O","fields":[{"name":"n","type":"long"}]}`)
	reg := newRegistry(t, fake.URL())
	ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	de, _ := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	ev := envelope.Event{Destination: "orders.v1"}
	if err := ser.Encode(ctx, &ev, sampleOrder()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := de.Decode(ctx, ev.Payload); err != nil {
		t.Fatal(err)
	}

	fake.srv.Close() // the registry goes away

	ev2 := envelope.Event{Destination: "orders.v1"}
	if err := ser.Encode(ctx, &ev2, sampleOrder()); err != nil {
		t.Fatalf("cached encode during outage: %v", err)
	}
	if _, _, err := de.Decode(ctx, ev2.Payload); err != nil {
		t.Fatalf("cached decode during outage: %v", err)
	}

	uncached := append(schema.AppendFrameHeader(nil, uint32(otherID)), 2)
	_, _, err = de.Decode(ctx, uncached)
	if !errors.Is(err, schema.ErrRegistryUnavailable) || !schema.IsRetryable(err) {
		t.Fatalf("uncached id during outage: err = %v, want ErrRegistryUnavailable", err)
	}
	if errors.Is(err, schema.ErrMalformedPayload) {
		t.Fatalf("outage classified as malformed payload (would dead-letter a good message): %v", err)
	}
	if !strings.Contains(err.Error(), "3 attempts") {
		t.Fatalf("error %q does not say it retried", err)
	}
	ev3 := envelope.Event{Destination: "orders.v2"}
	if err := ser.Encode(ctx, &ev3, sampleOrder()); !errors.Is(err, schema.ErrRegistryUnavailable) {
		t.Fatalf("uncached subject during outage: err = %v, want ErrRegistryUnavailable", err)
	}
}

// Transient 5xx answers are retried with backoff and then succeed.
func TestRetriesTransientErrors(t *testing.T) {
	t.Parallel()
	fake := newFakeRegistry(t)
	id := fake.register(t, "orders.v1-value", orderSchema)
	var failures atomic.Int32
	failures.Store(2)
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if failures.Add(-1) >= 0 {
			http.Error(w, `{"error_code":50001,"message":"store unavailable"}`, http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	reg := newRegistry(t, fake.URL())
	sch, err := reg.SchemaByID(context.Background(), id)
	if err != nil {
		t.Fatalf("SchemaByID after 2 transient failures: %v", err)
	}
	if sch.ID != id || fake.requests("GET /schemas/ids/") != 3 {
		t.Fatalf("got id %d after %d requests; want id %d after 3", sch.ID, fake.requests("GET /schemas/ids/"), id)
	}
}

func TestUnknownSchemaIDIsPermanent(t *testing.T) {
	t.Parallel()
	real := newRealRegistry(t)
	reg := newRegistry(t, real.URL())
	de, _ := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	_, _, err := de.Decode(context.Background(), []byte{0, 0, 0, 0x30, 0x39, 2})
	var de2 *schema.DecodeError
	if !errors.Is(err, schema.ErrUnknownSchemaID) || !errors.Is(err, schema.ErrMalformedPayload) || !errors.As(err, &de2) || de2.SchemaID != 12345 {
		t.Fatalf("err = %v, want a DecodeError ErrUnknownSchemaID for id 12345", err)
	}
	if schema.IsRetryable(err) || real.requests("GET /schemas/ids/12345") != 1 {
		t.Fatalf("a 404 was retried (%d requests) or called retryable", real.requests("GET /schemas/ids/12345"))
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	id := real.register(t, real.Name("ship.v1-value"), jsonSchema)
	reg := newRegistry(t, real.URL())
	ser, _ := schema.NewSerializer(reg, jsonSchema, schema.SerializerConfig{})
	de, _ := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	ev := envelope.Event{Destination: real.Name("ship.v1")}
	if err := ser.Encode(ctx, &ev, json.RawMessage(`{"id":"s","at":1,"carrier":null,"weights":[1],"dims":{},"kind":"PARCEL"}`)); err != nil {
		t.Fatal(err)
	}
	good := ev.Payload
	cases := []struct {
		name    string
		payload []byte
		kind    error
		says    string
	}{
		{"empty", nil, schema.ErrTruncatedFrame, "0 bytes"},
		{"short header", []byte{0, 0, 1}, schema.ErrTruncatedFrame, "3 bytes"},
		{"plain JSON", []byte(`{"id":"s"}`), schema.ErrWrongMagicByte, "0x7b"},
		{"trailing bytes", append(append([]byte{}, good...), 0, 0), schema.ErrPayloadMismatch, "2 trailing bytes"},
		{"truncated body", good[:len(good)-3], schema.ErrPayloadMismatch, "does not decode"},
		{"header only", good[:5], schema.ErrPayloadMismatch, "does not decode"},
		{"bad enum index", append(append([]byte{}, good[:len(good)-1]...), 0x08), schema.ErrPayloadMismatch, "does not decode"},
		{"negative string length", append(schema.AppendFrameHeader(nil, uint32(id)), 0x01), schema.ErrPayloadMismatch, "does not decode"},
	}
	for _, tc := range cases {
		for _, decode := range []func([]byte) error{
			func(p []byte) error { _, _, err := de.Decode(ctx, p); return err },
			func(p []byte) error { _, err := de.DecodeJSON(ctx, p); return err },
		} {
			err := decode(tc.payload)
			if !errors.Is(err, tc.kind) || !errors.Is(err, schema.ErrMalformedPayload) || schema.IsRetryable(err) {
				t.Errorf("%s: err = %v, want permanent %v", tc.name, err, tc.kind)
				continue
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, tc.says)
			}
		}
	}
}

func TestEventHook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real := newRealRegistry(t)
	real.register(t, real.Name("ship.v1-value"), jsonSchema)
	reg := newRegistry(t, real.URL())
	ser, _ := schema.NewSerializer(reg, jsonSchema, schema.SerializerConfig{JSON: schema.PlainJSON})
	de, _ := schema.NewDeserializer(reg, schema.DeserializerConfig{JSON: schema.PlainJSON})
	hook := de.EventHook()

	in := `{"id":"s","at":1,"carrier":"DHL","weights":[],"dims":{},"kind":"PARCEL"}`
	ev := envelope.Event{MessageID: "m-1", Destination: real.Name("ship.v1")}
	if err := ser.Encode(ctx, &ev, json.RawMessage(in)); err != nil {
		t.Fatal(err)
	}
	id := *ev.SchemaRef.SchemaID
	ev.SchemaRef = nil // a producer that did not fill it
	if err := hook(ctx, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.ContentType != envelope.ContentTypeJSON || !sameJSON(t, ev.Payload, []byte(in)) || ev.SchemaRef == nil || *ev.SchemaRef.SchemaID != id {
		t.Fatalf("hook left %q %s ref=%+v; want JSON %s with schema id %d", ev.ContentType, ev.Payload, ev.SchemaRef, in, id)
	}

	js := envelope.Event{ContentType: "application/json; charset=utf-8", Payload: []byte(`{"a":1}`)}
	if err := hook(ctx, &js); err != nil || string(js.Payload) != `{"a":1}` || js.ContentType != "application/json; charset=utf-8" {
		t.Fatalf("hook touched a JSON event: %v %+v", err, js)
	}

	bad := envelope.Event{MessageID: "m-2", ContentType: "Application/Avro", Payload: []byte("not avro")}
	err := hook(ctx, &bad)
	if !errors.Is(err, schema.ErrWrongMagicByte) || !strings.Contains(err.Error(), "m-2") || string(bad.Payload) != "not avro" {
		t.Fatalf("hook on a bad Avro event: err = %v, payload %q", err, bad.Payload)
	}
}

func TestIsAvroContentType(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string]bool{
		"application/avro": true, "Application/AVRO ; v=1": true, "avro/binary": true,
		"application/vnd.apache.avro+binary": true, "application/vnd.confluent.avro": true,
		"application/json": false, "": false, "application/avro+json": false, "text/avro": false,
	} {
		if got := schema.IsAvroContentType(ct); got != want {
			t.Errorf("IsAvroContentType(%q) = %v, want %v", ct, got, want)
		}
	}
}

// Concurrent misses for one id make one request.
func TestSingleflight(t *testing.T) {
	t.Parallel()
	fake := newFakeRegistry(t)
	id := fake.register(t, "orders.v1-value", orderSchema)
	const n = 16
	var entered sync.WaitGroup
	entered.Add(n)
	release := make(chan struct{})
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		<-release // hold the leader's request until every caller is waiting
		return false
	})
	reg := newRegistry(t, fake.URL())
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			entered.Done()
			_, err := reg.SchemaByID(context.Background(), id)
			errs <- err
		})
	}
	entered.Wait()
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := fake.requests("GET /schemas/ids/"); got > 2 {
		t.Fatalf("%d concurrent misses made %d requests, want 1 (2 at most if a caller arrived after the answer)", n, got)
	}
}

func TestBasicAuth(t *testing.T) {
	t.Parallel()
	const user, password = "keiro", "s3cret-pa55"
	fake := newFakeRegistry(t, srfake.WithAuth("Basic "+base64.StdEncoding.EncodeToString([]byte(user+":"+password))))
	id := fake.register(t, "orders.v1-value", orderSchema)

	good := newRegistry(t, fake.URL(), func(c *schema.RegistryConfig) { c.Username, c.Password = user, password })
	if _, err := good.SchemaByID(context.Background(), id); err != nil {
		t.Fatalf("with credentials: %v", err)
	}
	for name, mutate := range map[string]func(*schema.RegistryConfig){
		"none":  func(*schema.RegistryConfig) {},
		"wrong": func(c *schema.RegistryConfig) { c.Username, c.Password = user, "wrong-"+password },
	} {
		before := fake.requests("")
		reg := newRegistry(t, fake.URL(), mutate)
		_, err := reg.SchemaByID(context.Background(), id)
		if !errors.Is(err, schema.ErrRegistryUnavailable) || !strings.Contains(err.Error(), "check the registry user and password") {
			t.Fatalf("%s credentials: err = %v", name, err)
		}
		if strings.Contains(err.Error(), password) {
			t.Fatalf("error prints the password: %v", err)
		}
		if got := fake.requests("") - before; got != 1 {
			t.Fatalf("%s credentials: %d requests, want 1 (a rejected credential is not retried)", name, got)
		}
	}
	cfg := schema.RegistryConfig{URL: fake.URL(), Username: user, Password: password}
	for _, s := range []string{cfg.String(), fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg)} {
		if strings.Contains(s, password) {
			t.Fatalf("config printing shows the password: %s", s)
		}
	}
}

func TestRegistryConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := schema.NewRegistry(schema.RegistryConfig{URL: "ftp://u:pw@x", Username: "u", CertFile: "c", MaxAttempts: -1,
		HTTPClient: &http.Client{}})
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"URL", "Username, Password", "CertFile, KeyFile", "HTTPClient", "MaxAttempts"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "pw@") {
		t.Errorf("error shows URL credentials: %v", err)
	}
	if _, err := schema.NewRegistry(schema.RegistryConfig{}); err == nil || !strings.Contains(err.Error(), "URL: required") {
		t.Fatalf("empty config: %v", err)
	}
	if _, err := schema.NewRegistry(schema.RegistryConfig{URL: "https://u:p@reg:8081"}); err == nil ||
		!strings.Contains(err.Error(), "must not contain credentials") {
		t.Fatalf("URL with credentials: %v", err)
	}
}

// sameJSON compares JSON documents by value (goavro writes record fields in map order).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("not JSON: %s", a)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("not JSON: %s", b)
	}
	return reflect.DeepEqual(va, vb)
}

// A registry that calls a schema invalid which goavro accepts (HTTP 422, error 42201: a
// registry with stricter parsing, or another product's) refuses it permanently, in one
// request. The real registry's refusal, 409 for an incompatible schema, is
// TestRegisterIncompatibleRefused.
func TestRegisterRefusedAsInvalid(t *testing.T) {
	t.Parallel()
	fake := newFakeRegistry(t)
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPost && r.URL.Path == "/subjects/invalid-value/versions" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"error_code":42201,"message":"Invalid schema"}`)
			return true
		}
		return false
	})
	reg := newRegistry(t, fake.URL())
	_, err := reg.RegisterSchema(context.Background(), "invalid-value", orderSchema)
	if !errors.Is(err, schema.ErrInvalidSchema) || schema.IsRetryable(err) || !strings.Contains(err.Error(), "invalid-value") {
		t.Errorf("err = %v, want permanent ErrInvalidSchema naming the subject", err)
	}
	if n := fake.requests("POST /subjects/invalid-value/versions"); n != 1 {
		t.Errorf("%d requests, a refusal is not retried", n)
	}
}

// Close releases the registry's idle connections: a consumer that closes its Registry leaves no
// connection (and no goroutine) behind. Before, the transport that classifies answers hid them
// from http.Client.CloseIdleConnections.
func TestCloseReleasesConnections(t *testing.T) {
	t.Parallel()
	real := newRealRegistry(t)
	closed := make(chan struct{})
	var once sync.Once
	real.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			once.Do(func() { close(closed) })
		}
	}
	id := real.register(t, real.Name("orders.v1-value"), orderSchema)
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: real.URL()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.SchemaByID(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	reg.Close()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close left the connection to the registry open")
	}
}

// A caller's context ends the backoff wait at once.
func TestRetryHonoursContext(t *testing.T) {
	t.Parallel()
	fake := newFakeRegistry(t)
	first := make(chan struct{})
	var once sync.Once
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		once.Do(func() { close(first) })
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		return true
	})
	reg := newRegistry(t, fake.URL(), func(c *schema.RegistryConfig) {
		c.MaxAttempts, c.MinBackoff, c.MaxBackoff = 10, time.Hour, time.Hour
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-first; cancel() }()
	_, err := reg.SchemaByID(ctx, 7)
	// Returning at all proves the hour-long backoff was cut short.
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "fetch schema id 7") {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}
