package envelope_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

func ptr[T any](v T) *T { return &v }

func mustUUID(t testing.TB, s string) *envelope.UUID {
	t.Helper()
	u, err := envelope.ParseUUID(s)
	if err != nil {
		t.Fatal(err)
	}
	return &u
}

// sample is keiro's test fixture envelope (spec §3) with every field set.
func sample(t testing.TB) envelope.Event {
	return envelope.Event{
		MessageID:     "018f0f18-17aa-7000-8000-0000000000aa",
		Source:        "ordering",
		Destination:   "billing.orders.v1",
		Key:           ptr("order-123"),
		EventType:     "OrderSubmitted",
		SchemaVersion: 1,
		ContentType:   "application/json",
		SchemaRef: &envelope.SchemaRef{
			Registry:    ptr("confluent"),
			Subject:     ptr("billing.orders.v1.OrderSubmitted"),
			Version:     ptr(int64(1)),
			SchemaID:    ptr(int64(42)),
			Fingerprint: ptr("sha256:abc123"),
		},
		SourceEventID:        mustUUID(t, "018f0f18-17aa-7000-8000-000000000003"),
		SourceGlobalPosition: ptr(int64(42)),
		Payload:              []byte(`{"orderId":"order-123","quantity":5}`),
		OccurredAt:           time.Date(2023, 2, 25, 0, 0, 0, 0, time.UTC),
		CausationID:          mustUUID(t, "018f0f18-17aa-7000-8000-000000000004"),
		CorrelationID:        mustUUID(t, "018f0f18-17aa-7000-8000-000000000005"),
		TraceContext: &envelope.TraceContext{
			Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			Tracestate:  "rojo=00f067aa0ba902b7",
		},
		Attributes: json.RawMessage(`{"tenant":"acme"}`),
	}
}

// minimal has only the always-emitted fields.
func minimal() envelope.Event {
	return envelope.Event{
		MessageID:     "m-1",
		Source:        "ordering",
		Destination:   "billing.orders.v1",
		EventType:     "OrderSubmitted",
		SchemaVersion: 3,
		ContentType:   "application/vnd.apache.avro+binary",
		OccurredAt:    time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

// specHeaderNames is the list of keiro-spec §1.2.1, typed out independently of the package.
var specHeaderNames = []string{
	"keiro-message-id", "keiro-source", "keiro-destination", "keiro-event-type",
	"keiro-schema-version", "content-type", "keiro-schema-registry", "keiro-schema-subject",
	"keiro-schema-version-ref", "keiro-schema-id", "keiro-schema-fingerprint",
	"keiro-source-event-id", "keiro-source-global-position", "keiro-causation-id",
	"keiro-correlation-id", "traceparent", "tracestate", "keiro-occurred-at", "keiro-attributes",
}

func TestHeaderNamesMatchSpec(t *testing.T) {
	if got := envelope.HeaderNames[:]; !reflect.DeepEqual(got, specHeaderNames) {
		t.Fatalf("HeaderNames = %q\nwant %q", got, specHeaderNames)
	}
}

func TestHeadersGolden(t *testing.T) {
	e := sample(t)
	want := [][2]string{
		{"keiro-message-id", "018f0f18-17aa-7000-8000-0000000000aa"},
		{"keiro-source", "ordering"},
		{"keiro-destination", "billing.orders.v1"},
		{"keiro-event-type", "OrderSubmitted"},
		{"keiro-schema-version", "1"},
		{"content-type", "application/json"},
		{"keiro-schema-registry", "confluent"},
		{"keiro-schema-subject", "billing.orders.v1.OrderSubmitted"},
		{"keiro-schema-version-ref", "1"},
		{"keiro-schema-id", "42"},
		{"keiro-schema-fingerprint", "sha256:abc123"},
		{"keiro-source-event-id", "018f0f18-17aa-7000-8000-000000000003"},
		{"keiro-source-global-position", "42"},
		{"keiro-causation-id", "018f0f18-17aa-7000-8000-000000000004"},
		{"keiro-correlation-id", "018f0f18-17aa-7000-8000-000000000005"},
		{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{"tracestate", "rojo=00f067aa0ba902b7"},
		{"keiro-occurred-at", "2023-02-25T00:00:00Z"},
		{"keiro-attributes", `{"tenant":"acme"}`},
	}
	got := e.Headers()
	if len(got) != len(want) {
		t.Fatalf("got %d headers, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		t.Run(w[0], func(t *testing.T) {
			if got[i].Key != w[0] {
				t.Errorf("header %d name = %q, want %q", i, got[i].Key, w[0])
			}
			if string(got[i].Value) != w[1] {
				t.Errorf("header %s value = %q, want %q", w[0], got[i].Value, w[1])
			}
		})
	}
}

func TestHeaderValueFormats(t *testing.T) {
	cases := []struct {
		name   string
		edit   func(*envelope.Event)
		header string
		want   string
	}{
		{"negative schema version", func(e *envelope.Event) { e.SchemaVersion = -7 }, "keiro-schema-version", "-7"},
		{"max int64 position", func(e *envelope.Event) { e.SourceGlobalPosition = ptr(int64(math.MaxInt64)) }, "keiro-source-global-position", "9223372036854775807"},
		{"min int64 schema id", func(e *envelope.Event) { e.SchemaRef.SchemaID = ptr(int64(math.MinInt64)) }, "keiro-schema-id", "-9223372036854775808"},
		{"uppercase-parsed uuid prints lowercase", func(e *envelope.Event) {
			e.CausationID = mustUUID(t, "018F0F18-17AA-7000-8000-0000000000AB")
		}, "keiro-causation-id", "018f0f18-17aa-7000-8000-0000000000ab"},
		{"fraction trimmed", func(e *envelope.Event) {
			e.OccurredAt = time.Date(2023, 2, 25, 13, 4, 5, 120000000, time.UTC)
		}, "keiro-occurred-at", "2023-02-25T13:04:05.12Z"},
		{"nanoseconds", func(e *envelope.Event) {
			e.OccurredAt = time.Date(2023, 2, 25, 13, 4, 5, 1, time.UTC)
		}, "keiro-occurred-at", "2023-02-25T13:04:05.000000001Z"},
		{"converted to UTC", func(e *envelope.Event) {
			e.OccurredAt = time.Date(2023, 2, 25, 1, 0, 0, 0, time.FixedZone("CET", 3600))
		}, "keiro-occurred-at", "2023-02-25T00:00:00Z"},
		{"attributes compacted", func(e *envelope.Event) {
			e.Attributes = json.RawMessage("{ \"a\" : [1, 2],\n \"b\": null }")
		}, "keiro-attributes", `{"a":[1,2],"b":null}`},
		{"content type verbatim", func(e *envelope.Event) { e.ContentType = "Application/JSON; Charset=UTF-8" }, "content-type", "Application/JSON; Charset=UTF-8"},
		{"empty traceparent kept", func(e *envelope.Event) { e.TraceContext = &envelope.TraceContext{} }, "traceparent", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := sample(t)
			c.edit(&e)
			v, ok := find(e.Headers(), c.header)
			if !ok {
				t.Fatalf("header %s not emitted", c.header)
			}
			if v != c.want {
				t.Fatalf("header %s = %q, want %q", c.header, v, c.want)
			}
		})
	}
}

func find(hs []envelope.Header, name string) (string, bool) {
	for _, h := range hs {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

func names(hs []envelope.Header) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Key
	}
	return out
}

func TestOptionalHeadersOnlyWhenSet(t *testing.T) {
	e := minimal()
	want := []string{"keiro-message-id", "keiro-source", "keiro-destination", "keiro-event-type",
		"keiro-schema-version", "content-type", "keiro-occurred-at"}
	if got := names(e.Headers()); !reflect.DeepEqual(got, want) {
		t.Fatalf("minimal event headers = %q, want %q", got, want)
	}

	// Each optional field alone adds exactly its header, in its place.
	optional := map[string]func(*envelope.Event){
		"keiro-schema-registry":        func(e *envelope.Event) { e.SchemaRef = &envelope.SchemaRef{Registry: ptr("r")} },
		"keiro-schema-subject":         func(e *envelope.Event) { e.SchemaRef = &envelope.SchemaRef{Subject: ptr("s")} },
		"keiro-schema-version-ref":     func(e *envelope.Event) { e.SchemaRef = &envelope.SchemaRef{Version: ptr(int64(2))} },
		"keiro-schema-id":              func(e *envelope.Event) { e.SchemaRef = &envelope.SchemaRef{SchemaID: ptr(int64(9))} },
		"keiro-schema-fingerprint":     func(e *envelope.Event) { e.SchemaRef = &envelope.SchemaRef{Fingerprint: ptr("f")} },
		"keiro-source-event-id":        func(e *envelope.Event) { e.SourceEventID = ptr(envelope.NewUUIDv7()) },
		"keiro-source-global-position": func(e *envelope.Event) { e.SourceGlobalPosition = ptr(int64(0)) },
		"keiro-causation-id":           func(e *envelope.Event) { e.CausationID = ptr(envelope.NewUUIDv7()) },
		"keiro-correlation-id":         func(e *envelope.Event) { e.CorrelationID = ptr(envelope.NewUUIDv7()) },
		"traceparent":                  func(e *envelope.Event) { e.TraceContext = &envelope.TraceContext{Traceparent: "x"} },
		"keiro-attributes":             func(e *envelope.Event) { e.Attributes = json.RawMessage(`null`) },
	}
	for name, set := range optional {
		t.Run(name, func(t *testing.T) {
			e := minimal()
			set(&e)
			var w []string
			for _, n := range specHeaderNames {
				if n == name || (n != "tracestate" && contains(want, n)) {
					w = append(w, n)
				}
			}
			if got := names(e.Headers()); !reflect.DeepEqual(got, w) {
				t.Fatalf("headers = %q, want %q", got, w)
			}
		})
	}
	t.Run("tracestate needs traceparent and a value", func(t *testing.T) {
		e := minimal()
		e.TraceContext = &envelope.TraceContext{Traceparent: "tp", Tracestate: ""}
		if _, ok := find(e.Headers(), "tracestate"); ok {
			t.Fatal("empty tracestate emitted")
		}
		e.TraceContext.Tracestate = "a=b"
		if v, _ := find(e.Headers(), "tracestate"); v != "a=b" {
			t.Fatalf("tracestate = %q", v)
		}
	})
	t.Run("empty SchemaRef emits nothing", func(t *testing.T) {
		e := minimal()
		e.SchemaRef = &envelope.SchemaRef{}
		if got := names(e.Headers()); !reflect.DeepEqual(got, want) {
			t.Fatalf("headers = %q", got)
		}
	})
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func TestAppendHeadersKeepsDst(t *testing.T) {
	e := minimal()
	dst := []envelope.Header{{Key: "x-app", Value: []byte("1")}}
	got := e.AppendHeaders(dst, envelope.EncodeOptions{})
	if got[0].Key != "x-app" || len(got) != 8 {
		t.Fatalf("AppendHeaders = %q", names(got))
	}
}

func TestRecord(t *testing.T) {
	e := sample(t)
	r := e.Record(envelope.EncodeOptions{})
	if r.Topic != "billing.orders.v1" || string(r.Key) != "order-123" || string(r.Value) != string(e.Payload) {
		t.Fatalf("record = %+v", r)
	}
	if v, _ := find(r.Headers, "keiro-message-id"); v != e.MessageID {
		t.Fatalf("message id header = %q", v)
	}
	e.Key = nil
	if r := e.Record(envelope.EncodeOptions{}); r.Key != nil {
		t.Fatalf("nil Key gave record key %q", r.Key)
	}
	e.Key = ptr("")
	if r := e.Record(envelope.EncodeOptions{}); r.Key == nil || len(r.Key) != 0 {
		t.Fatalf("empty Key gave record key %#v", r.Key)
	}
}

func recordOf(e envelope.Event) envelope.Record {
	r := e.Record(envelope.EncodeOptions{})
	r.Partition, r.Offset = 2, 113
	r.Timestamp = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	return r
}

func TestDecodeRoundTripSample(t *testing.T) {
	e := sample(t)
	got, err := envelope.Decode(recordOf(e))
	if err != nil {
		t.Fatal(err)
	}
	assertEqual(t, got, e)
}

func assertEqual(t testing.TB, got, want envelope.Event) {
	t.Helper()
	if !got.OccurredAt.Equal(want.OccurredAt) {
		t.Fatalf("OccurredAt = %v, want %v", got.OccurredAt, want.OccurredAt)
	}
	got.OccurredAt, want.OccurredAt = time.Time{}, time.Time{}
	if len(got.Payload) == 0 && len(want.Payload) == 0 {
		got.Payload, want.Payload = nil, nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded event differs\n got %s\nwant %s", dump(got), dump(want))
	}
}

func dump(e envelope.Event) string {
	b, _ := json.Marshal(e)
	return string(b)
}

// without returns r without the named header.
func without(r envelope.Record, name string) envelope.Record {
	var hs []envelope.Header
	for _, h := range r.Headers {
		if h.Key != name {
			hs = append(hs, h)
		}
	}
	r.Headers = hs
	return r
}

// with returns r with the named header's value replaced (or appended).
func with(r envelope.Record, name, value string) envelope.Record {
	hs := append([]envelope.Header(nil), r.Headers...)
	for i := range hs {
		if hs[i].Key == name {
			hs[i].Value = []byte(value)
			r.Headers = hs
			return r
		}
	}
	r.Headers = append(hs, envelope.Header{Key: name, Value: []byte(value)})
	return r
}

func TestDecodeOccurredAtAbsentUsesTimestamp(t *testing.T) {
	r := without(recordOf(sample(t)), "keiro-occurred-at")
	e, err := envelope.Decode(r)
	if err != nil {
		t.Fatal(err)
	}
	if !e.OccurredAt.Equal(r.Timestamp) {
		t.Fatalf("OccurredAt = %v, want record timestamp %v", e.OccurredAt, r.Timestamp)
	}
}

func TestDecodeErrors(t *testing.T) {
	base := recordOf(sample(t))
	cases := []struct {
		name   string
		rec    envelope.Record
		kind   envelope.HeaderErrorKind
		is     error
		header string
		value  string
	}{
		{"missing message id", without(base, "keiro-message-id"), envelope.MissingHeader, envelope.ErrMissingHeader, "keiro-message-id", ""},
		{"missing source", without(base, "keiro-source"), envelope.MissingHeader, envelope.ErrMissingHeader, "keiro-source", ""},
		{"missing destination", without(base, "keiro-destination"), envelope.MissingHeader, envelope.ErrMissingHeader, "keiro-destination", ""},
		{"missing event type", without(base, "keiro-event-type"), envelope.MissingHeader, envelope.ErrMissingHeader, "keiro-event-type", ""},
		{"missing schema version", without(base, "keiro-schema-version"), envelope.MissingHeader, envelope.ErrMissingHeader, "keiro-schema-version", ""},
		{"missing content type", without(base, "content-type"), envelope.MissingHeader, envelope.ErrMissingHeader, "content-type", ""},
		{"schema version not int", with(base, "keiro-schema-version", "1.0"), envelope.InvalidIntHeader, envelope.ErrInvalidIntHeader, "keiro-schema-version", "1.0"},
		{"schema version empty", with(base, "keiro-schema-version", ""), envelope.InvalidIntHeader, envelope.ErrInvalidIntHeader, "keiro-schema-version", ""},
		{"schema version trailing space", with(base, "keiro-schema-version", "1 "), envelope.InvalidIntHeader, envelope.ErrInvalidIntHeader, "keiro-schema-version", "1 "},
		{"schema version sign only", with(base, "keiro-schema-version", "-"), envelope.InvalidIntHeader, envelope.ErrInvalidIntHeader, "keiro-schema-version", "-"},
		{"schema version overflow", with(base, "keiro-schema-version", "9223372036854775808"), envelope.InvalidIntHeader, envelope.ErrInvalidIntHeader, "keiro-schema-version", "9223372036854775808"},
		{"version ref not int", with(base, "keiro-schema-version-ref", "v1"), envelope.InvalidIntHeader, envelope.ErrInvalidIntHeader, "keiro-schema-version-ref", "v1"},
		{"schema id not int", with(base, "keiro-schema-id", "0x2a"), envelope.InvalidIntHeader, envelope.ErrInvalidIntHeader, "keiro-schema-id", "0x2a"},
		{"source event id not uuid", with(base, "keiro-source-event-id", "not-a-uuid"), envelope.InvalidUUIDHeader, envelope.ErrInvalidUUIDHeader, "keiro-source-event-id", "not-a-uuid"},
		{"source event id unhyphenated", with(base, "keiro-source-event-id", "018f0f1817aa70008000000000000003"), envelope.InvalidUUIDHeader, envelope.ErrInvalidUUIDHeader, "keiro-source-event-id", "018f0f1817aa70008000000000000003"},
		{"global position not int", with(base, "keiro-source-global-position", "42x"), envelope.InvalidIntHeader, envelope.ErrInvalidIntHeader, "keiro-source-global-position", "42x"},
		{"causation id not uuid", with(base, "keiro-causation-id", "x"), envelope.InvalidUUIDHeader, envelope.ErrInvalidUUIDHeader, "keiro-causation-id", "x"},
		{"correlation id not uuid", with(base, "keiro-correlation-id", "018f0f18-17aa-7000-8000-00000000000g"), envelope.InvalidUUIDHeader, envelope.ErrInvalidUUIDHeader, "keiro-correlation-id", "018f0f18-17aa-7000-8000-00000000000g"},
		{"occurred at not a time", with(base, "keiro-occurred-at", "not-a-time"), envelope.InvalidTimeHeader, envelope.ErrInvalidTimeHeader, "keiro-occurred-at", "not-a-time"},
		{"occurred at without zone", with(base, "keiro-occurred-at", "2023-02-25T00:00:00"), envelope.InvalidTimeHeader, envelope.ErrInvalidTimeHeader, "keiro-occurred-at", "2023-02-25T00:00:00"},
		{"occurred at feb 30", with(base, "keiro-occurred-at", "2023-02-30T00:00:00Z"), envelope.InvalidTimeHeader, envelope.ErrInvalidTimeHeader, "keiro-occurred-at", "2023-02-30T00:00:00Z"},
		{"occurred at 13 fraction digits", with(base, "keiro-occurred-at", "2023-02-25T00:00:00.1234567890123Z"), envelope.InvalidTimeHeader, envelope.ErrInvalidTimeHeader, "keiro-occurred-at", "2023-02-25T00:00:00.1234567890123Z"},
		{"occurred at empty fraction", with(base, "keiro-occurred-at", "2023-02-25T00:00:00.Z"), envelope.InvalidTimeHeader, envelope.ErrInvalidTimeHeader, "keiro-occurred-at", "2023-02-25T00:00:00.Z"},
		{"attributes not json", with(base, "keiro-attributes", "{not-json"), envelope.InvalidJSONHeader, envelope.ErrInvalidJSONHeader, "keiro-attributes", "{not-json"},
		{"attributes empty", with(base, "keiro-attributes", ""), envelope.InvalidJSONHeader, envelope.ErrInvalidJSONHeader, "keiro-attributes", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := envelope.Decode(c.rec)
			if err == nil {
				t.Fatal("Decode succeeded")
			}
			var he *envelope.HeaderError
			if !errors.As(err, &he) {
				t.Fatalf("error %T %v is not a *HeaderError", err, err)
			}
			if he.Kind != c.kind || he.Header != c.header || he.Value != c.value {
				t.Fatalf("error = %+v, want kind %v header %q value %q", he, c.kind, c.header, c.value)
			}
			if !errors.Is(err, c.is) {
				t.Fatalf("errors.Is(%v, %v) = false", err, c.is)
			}
			for _, other := range []error{envelope.ErrMissingHeader, envelope.ErrInvalidIntHeader, envelope.ErrInvalidUUIDHeader, envelope.ErrInvalidTimeHeader, envelope.ErrInvalidJSONHeader} {
				if !errors.Is(other, c.is) && errors.Is(err, other) {
					t.Fatalf("errors.Is(%v, %v) = true", err, other)
				}
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", c.header)) {
				t.Fatalf("message %q does not name header %q", err, c.header)
			}
			if c.value != "" && !strings.Contains(err.Error(), fmt.Sprintf("%q", c.value)) {
				t.Fatalf("message %q does not quote value %q", err, c.value)
			}
		})
	}
}

func TestHeaderErrorMessageBounded(t *testing.T) {
	long := strings.Repeat("é", 1000)
	_, err := envelope.Decode(with(recordOf(sample(t)), "keiro-schema-version", long))
	if err == nil {
		t.Fatal("Decode succeeded")
	}
	if n := len(err.Error()); n > 200 {
		t.Fatalf("message is %d bytes: %s", n, err)
	}
	var he *envelope.HeaderError
	if !errors.As(err, &he) || he.Value != long {
		t.Fatal("HeaderError.Value does not keep the full value")
	}
	if !strings.Contains(err.Error(), "2000 bytes") {
		t.Fatalf("message does not give the full length: %s", err)
	}
}

func TestDecodeCheckOrder(t *testing.T) {
	// keiro's order: source, destination, event-type, schema-version, content-type, message-id,
	// schema-ref (version-ref, schema-id), source-event-id, source-global-position,
	// causation-id, correlation-id, occurred-at, attributes.
	breakers := []struct {
		header string
		broken func(envelope.Record) envelope.Record
	}{
		{"keiro-source", func(r envelope.Record) envelope.Record { return without(r, "keiro-source") }},
		{"keiro-destination", func(r envelope.Record) envelope.Record { return without(r, "keiro-destination") }},
		{"keiro-event-type", func(r envelope.Record) envelope.Record { return without(r, "keiro-event-type") }},
		{"keiro-schema-version", func(r envelope.Record) envelope.Record { return with(r, "keiro-schema-version", "x") }},
		{"content-type", func(r envelope.Record) envelope.Record { return without(r, "content-type") }},
		{"keiro-message-id", func(r envelope.Record) envelope.Record { return without(r, "keiro-message-id") }},
		{"keiro-schema-version-ref", func(r envelope.Record) envelope.Record { return with(r, "keiro-schema-version-ref", "x") }},
		{"keiro-schema-id", func(r envelope.Record) envelope.Record { return with(r, "keiro-schema-id", "x") }},
		{"keiro-source-event-id", func(r envelope.Record) envelope.Record { return with(r, "keiro-source-event-id", "x") }},
		{"keiro-source-global-position", func(r envelope.Record) envelope.Record { return with(r, "keiro-source-global-position", "x") }},
		{"keiro-causation-id", func(r envelope.Record) envelope.Record { return with(r, "keiro-causation-id", "x") }},
		{"keiro-correlation-id", func(r envelope.Record) envelope.Record { return with(r, "keiro-correlation-id", "x") }},
		{"keiro-occurred-at", func(r envelope.Record) envelope.Record { return with(r, "keiro-occurred-at", "x") }},
		{"keiro-attributes", func(r envelope.Record) envelope.Record { return with(r, "keiro-attributes", "x") }},
	}
	base := recordOf(sample(t))
	// Every pair of problems reports the earlier one, whatever the header order on the record.
	for i := range breakers {
		for j := i + 1; j < len(breakers); j++ {
			for _, rev := range []bool{false, true} {
				r := breakers[j].broken(breakers[i].broken(base))
				if rev {
					for a, b := 0, len(r.Headers)-1; a < b; a, b = a+1, b-1 {
						r.Headers[a], r.Headers[b] = r.Headers[b], r.Headers[a]
					}
				}
				_, err := envelope.Decode(r)
				var he *envelope.HeaderError
				if !errors.As(err, &he) || he.Header != breakers[i].header {
					t.Fatalf("%s + %s (reversed %v): got %v, want error on %s", breakers[i].header, breakers[j].header, rev, err, breakers[i].header)
				}
			}
		}
	}
}

func TestDecodeLookupRules(t *testing.T) {
	base := recordOf(sample(t))
	t.Run("first match wins", func(t *testing.T) {
		r := base
		r.Headers = append(append([]envelope.Header(nil), r.Headers...),
			envelope.Header{Key: "keiro-source", Value: []byte("second")},
			envelope.Header{Key: "keiro-schema-version", Value: []byte("not-an-int")})
		e, err := envelope.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if e.Source != "ordering" {
			t.Fatalf("Source = %q, want the first header's value", e.Source)
		}
	})
	t.Run("case sensitive", func(t *testing.T) {
		r := without(base, "keiro-source")
		r.Headers = append(r.Headers, envelope.Header{Key: "Keiro-Source", Value: []byte("ordering")})
		if _, err := envelope.Decode(r); !errors.Is(err, envelope.ErrMissingHeader) {
			t.Fatalf("err = %v, want missing keiro-source", err)
		}
	})
	t.Run("tracestate without traceparent is ignored", func(t *testing.T) {
		e, err := envelope.Decode(without(base, "traceparent"))
		if err != nil {
			t.Fatal(err)
		}
		if e.TraceContext != nil {
			t.Fatalf("TraceContext = %+v, want nil", e.TraceContext)
		}
	})
	t.Run("traceparent not validated", func(t *testing.T) {
		e, err := envelope.Decode(with(base, "traceparent", "garbage"))
		if err != nil {
			t.Fatal(err)
		}
		if e.TraceContext.Traceparent != "garbage" {
			t.Fatalf("Traceparent = %q", e.TraceContext.Traceparent)
		}
	})
	t.Run("signed ints", func(t *testing.T) {
		e, err := envelope.Decode(with(with(base, "keiro-schema-version", "+7"), "keiro-source-global-position", "-9223372036854775808"))
		if err != nil {
			t.Fatal(err)
		}
		if e.SchemaVersion != 7 || *e.SourceGlobalPosition != math.MinInt64 {
			t.Fatalf("SchemaVersion %d, position %d", e.SchemaVersion, *e.SourceGlobalPosition)
		}
	})
	t.Run("uppercase uuid", func(t *testing.T) {
		e, err := envelope.Decode(with(base, "keiro-causation-id", "018F0F18-17AA-7000-8000-0000000000AB"))
		if err != nil {
			t.Fatal(err)
		}
		if e.CausationID.String() != "018f0f18-17aa-7000-8000-0000000000ab" {
			t.Fatalf("CausationID = %s", e.CausationID)
		}
	})
	t.Run("only some schema ref headers", func(t *testing.T) {
		r := base
		for _, n := range []string{"keiro-schema-registry", "keiro-schema-subject", "keiro-schema-version-ref", "keiro-schema-fingerprint"} {
			r = without(r, n)
		}
		e, err := envelope.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if e.SchemaRef == nil || *e.SchemaRef.SchemaID != 42 || e.SchemaRef.Subject != nil {
			t.Fatalf("SchemaRef = %+v", e.SchemaRef)
		}
		for _, n := range []string{"keiro-schema-id"} {
			r = without(r, n)
		}
		if e, _ := envelope.Decode(r); e.SchemaRef != nil {
			t.Fatalf("SchemaRef = %+v, want nil", e.SchemaRef)
		}
	})
	t.Run("null key and attributes compacted", func(t *testing.T) {
		r := with(base, "keiro-attributes", " { \"a\" : 1 } ")
		r.Key = nil
		e, err := envelope.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if e.Key != nil {
			t.Fatalf("Key = %q, want nil", *e.Key)
		}
		if string(e.Attributes) != `{"a":1}` {
			t.Fatalf("Attributes = %s", e.Attributes)
		}
	})
	t.Run("invalid UTF-8 kept verbatim", func(t *testing.T) {
		e, err := envelope.Decode(with(base, "keiro-event-type", "Order\xffSubmitted"))
		if err != nil {
			t.Fatal(err)
		}
		if e.EventType != "Order\xffSubmitted" {
			t.Fatalf("EventType = %q", e.EventType)
		}
		if v, _ := find(e.Headers(), "keiro-event-type"); v != "Order\xffSubmitted" {
			t.Fatalf("re-encoded = %q", v)
		}
	})
}

func TestDecodeOccurredAtFormats(t *testing.T) {
	cases := []struct{ in, want string }{
		{"2023-02-25T00:00:00Z", "2023-02-25T00:00:00Z"},
		{"2023-02-25T00:00:00.5Z", "2023-02-25T00:00:00.5Z"},
		{"2023-02-25T00:00:00.123456789Z", "2023-02-25T00:00:00.123456789Z"},
		{"2023-02-25T00:00:00.123456789012Z", "2023-02-25T00:00:00.123456789Z"}, // keiro's 12 digits, truncated
		{"2023-02-25T00:00:00.999999999999Z", "2023-02-25T00:00:00.999999999Z"},
		{"2023-02-25T00:00:00+00:00", "2023-02-25T00:00:00Z"},
		{"2023-02-25T01:30:00+01:30", "2023-02-25T00:00:00Z"},
		{"2023-02-24T19:00:00.25-05:00", "2023-02-25T00:00:00.25Z"},
		{"2024-02-29T23:59:59Z", "2024-02-29T23:59:59Z"},
		{"0000-01-01T00:00:00Z", "0000-01-01T00:00:00Z"},
		{"9999-12-31T23:59:59Z", "9999-12-31T23:59:59Z"},
	}
	base := recordOf(sample(t))
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			e, err := envelope.Decode(with(base, "keiro-occurred-at", c.in))
			if err != nil {
				t.Fatal(err)
			}
			if got := envelope.FormatTime(e.OccurredAt); got != c.want {
				t.Fatalf("OccurredAt = %s, want %s", got, c.want)
			}
			if e.OccurredAt.Location() != time.UTC {
				t.Fatalf("OccurredAt location = %v", e.OccurredAt.Location())
			}
		})
	}
	for _, bad := range []string{
		"2023-02-25 00:00:00Z", "2023-02-25t00:00:00Z", "2023-02-25T00:00:00z", "2023-02-25T24:00:00Z",
		"2023-02-25T00:00:60Z", "2023-13-01T00:00:00Z", "2023-00-01T00:00:00Z", "2023-02-25T00:00:00+0100",
		"2023-02-25T00:00:00+24:00", "23-02-25T00:00:00Z", "2023-02-25T00:00:00ZZ", "2023-2-25T00:00:00Z",
		"0000-01-01T00:00:00+00:01", "9999-12-31T23:59:59-00:01", "2023-02-25T00:00:00.-1Z",
		"２023-02-25T00:00:00Z",
	} {
		t.Run("bad "+bad, func(t *testing.T) {
			if _, err := envelope.Decode(with(base, "keiro-occurred-at", bad)); !errors.Is(err, envelope.ErrInvalidTimeHeader) {
				t.Fatalf("err = %v, want InvalidTimeHeader", err)
			}
		})
	}
}

func TestIsJSONContentType(t *testing.T) {
	cases := []struct {
		in   string
		want bool
	}{
		{"application/json", true},
		{"Application/JSON", true},
		{"application/json; charset=utf-8", true},
		{"APPLICATION/JSON ; CHARSET=UTF-8", true},
		{"  application/json  ", true},
		{"\tapplication/json\r\n;x", true},
		{"application/json;", true},
		{"\u00a0application/json\u3000; charset=utf-8", true}, // Haskell isSpace: NBSP, ideographic space
		{"\u0085application/json", false},                     // NEL is not isSpace in Haskell
		{"\u2028application/json", false},                     // nor is the line separator (Zl)
		{"application/vnd.apache.avro+binary", false},
		{"application/avro", false},
		{"application/problem+json", false},
		{"application/jsonx", false},
		{"application / json", false},
		{"text/json", false},
		{"", false},
		{";application/json", false},
	}
	for _, c := range cases {
		if got := envelope.IsJSONContentType(c.in); got != c.want {
			t.Errorf("IsJSONContentType(%q) = %v, want %v", c.in, got, c.want)
		}
		e := envelope.Event{ContentType: c.in}
		if got := e.IsJSON(); got != c.want {
			t.Errorf("IsJSON with %q = %v, want %v", c.in, got, c.want)
		}
	}
}

type orderSubmitted struct {
	OrderID  string `json:"orderId"`
	Quantity int    `json:"quantity"`
}

func TestJSONPayload(t *testing.T) {
	tpl := minimal()
	e, err := envelope.EncodeJSON(tpl, orderSubmitted{"order-123", 5})
	if err != nil {
		t.Fatal(err)
	}
	if e.ContentType != envelope.ContentTypeJSON || e.MessageID != tpl.MessageID || e.Destination != tpl.Destination || e.SchemaVersion != tpl.SchemaVersion {
		t.Fatalf("EncodeJSON changed the template: %+v", e)
	}
	var got orderSubmitted
	if err := envelope.DecodeJSON(&e, &got); err != nil {
		t.Fatal(err)
	}
	if got != (orderSubmitted{"order-123", 5}) {
		t.Fatalf("round trip = %+v", got)
	}
	if _, err := envelope.EncodeJSON(tpl, func() {}); err == nil {
		t.Fatal("EncodeJSON of a func succeeded")
	}

	cases := []struct {
		name        string
		contentType string
		payload     string
		want        error
	}{
		{"avro content type", "application/vnd.apache.avro+binary", `{"orderId":"x"}`, envelope.ErrUnsupportedContentType},
		{"content type checked before payload", "text/plain", `{not-json`, envelope.ErrUnsupportedContentType},
		{"malformed", "application/json", `{not-json`, envelope.ErrMalformedPayload},
		{"empty payload", "application/json; charset=utf-8", ``, envelope.ErrMalformedPayload},
		{"wrong shape", "application/json", `{"orderId":5}`, envelope.ErrDecodeFailed},
		{"wrong top-level type", "application/json", `[1,2]`, envelope.ErrDecodeFailed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := minimal()
			e.ContentType, e.Payload = c.contentType, []byte(c.payload)
			var v orderSubmitted
			err := envelope.DecodeJSON(&e, &v)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
		})
	}
}
