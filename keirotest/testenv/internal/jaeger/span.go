package jaeger

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Span is one span as Jaeger returns it, flattened from OTLP's resource → scope → span nesting.
type Span struct {
	// TraceID, SpanID and ParentSpanID are lower-case hex; ParentSpanID is empty for a root.
	TraceID, SpanID, ParentSpanID string
	// Name is the span's name.
	Name string
	// Kind is internal, server, client, producer or consumer ("" when unspecified).
	Kind string
	// Service is the resource's service.name.
	Service string
	// Scope is the instrumentation scope's name.
	Scope string
	// Attributes are the span's attributes: string, int64, bool, float64 or []any values.
	Attributes map[string]any
	// Links are the span's links.
	Links []Link
	// Status is the status code: unset, ok or error.
	Status string
}

// Link is one link of a span.
type Link struct {
	// TraceID and SpanID are the linked span's ids, lower-case hex.
	TraceID, SpanID string
}

// traceDoc is the answer of /api/v3/traces/{id}: OTLP's TracesData in protobuf's JSON mapping.
type traceDoc struct {
	Result struct {
		ResourceSpans []struct {
			Resource struct {
				Attributes []keyValue `json:"attributes"`
			} `json:"resource"`
			ScopeSpans []struct {
				Scope struct {
					Name string `json:"name"`
				} `json:"scope"`
				Spans []struct {
					TraceID      string          `json:"traceId"`
					SpanID       string          `json:"spanId"`
					ParentSpanID string          `json:"parentSpanId"`
					Name         string          `json:"name"`
					Kind         json.RawMessage `json:"kind"`
					Attributes   []keyValue      `json:"attributes"`
					Links        []struct {
						TraceID string `json:"traceId"`
						SpanID  string `json:"spanId"`
					} `json:"links"`
					Status struct {
						Code json.RawMessage `json:"code"`
					} `json:"status"`
				} `json:"spans"`
			} `json:"scopeSpans"`
		} `json:"resourceSpans"`
	} `json:"result"`
}

// keyValue is OTLP's KeyValue in JSON.
type keyValue struct {
	Key   string   `json:"key"`
	Value anyValue `json:"value"`
}

// anyValue is OTLP's AnyValue in JSON (64-bit integers are strings in protobuf's mapping).
type anyValue struct {
	StringValue *string          `json:"stringValue"`
	BoolValue   *bool            `json:"boolValue"`
	IntValue    *json.RawMessage `json:"intValue"`
	DoubleValue *float64         `json:"doubleValue"`
	ArrayValue  *struct {
		Values []anyValue `json:"values"`
	} `json:"arrayValue"`
}

func (v anyValue) value() (any, error) {
	switch {
	case v.StringValue != nil:
		return *v.StringValue, nil
	case v.BoolValue != nil:
		return *v.BoolValue, nil
	case v.IntValue != nil:
		n, err := strconv.ParseInt(strings.Trim(string(*v.IntValue), `"`), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("intValue %s: %w", *v.IntValue, err)
		}
		return n, nil
	case v.DoubleValue != nil:
		return *v.DoubleValue, nil
	case v.ArrayValue != nil:
		out := make([]any, 0, len(v.ArrayValue.Values))
		for _, e := range v.ArrayValue.Values {
			x, err := e.value()
			if err != nil {
				return nil, err
			}
			out = append(out, x)
		}
		return out, nil
	}
	return nil, nil
}

func attributes(kvs []keyValue) (map[string]any, error) {
	out := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		v, err := kv.Value.value()
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", kv.Key, err)
		}
		out[kv.Key] = v
	}
	return out, nil
}

// The OTLP enums in both of protobuf's JSON spellings: the number, or the value's name.
var (
	kinds    = []string{"", "internal", "server", "client", "producer", "consumer"}
	statuses = []string{"unset", "ok", "error"}
)

func enum(raw json.RawMessage, names []string, prefix string) (string, error) {
	if len(raw) == 0 {
		return names[0], nil
	}
	var n int
	if err := json.Unmarshal(raw, &n); err == nil {
		if n < 0 || n >= len(names) {
			return "", fmt.Errorf("unknown value %d", n)
		}
		return names[n], nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("neither a number nor a name: %s", raw)
	}
	s = strings.ToLower(strings.TrimPrefix(s, prefix))
	if s == "unspecified" {
		return names[0], nil
	}
	for _, name := range names {
		if s == name {
			return name, nil
		}
	}
	return "", fmt.Errorf("unknown value %q", s)
}

// DecodeTrace decodes an answer of the query API's /api/v3/traces/{id} (OTLP's TracesData in
// protobuf's JSON mapping) into its spans.
func DecodeTrace(b []byte) ([]Span, error) {
	var d traceDoc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("decode the trace: %w", err)
	}
	var out []Span
	for _, rs := range d.Result.ResourceSpans {
		res, err := attributes(rs.Resource.Attributes)
		if err != nil {
			return nil, fmt.Errorf("resource: %w", err)
		}
		service, _ := res["service.name"].(string)
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				kind, err := enum(s.Kind, kinds, "SPAN_KIND_")
				if err != nil {
					return nil, fmt.Errorf("span %s kind: %w", s.SpanID, err)
				}
				status, err := enum(s.Status.Code, statuses, "STATUS_CODE_")
				if err != nil {
					return nil, fmt.Errorf("span %s status: %w", s.SpanID, err)
				}
				attrs, err := attributes(s.Attributes)
				if err != nil {
					return nil, fmt.Errorf("span %s: %w", s.SpanID, err)
				}
				sp := Span{
					TraceID: strings.ToLower(s.TraceID), SpanID: strings.ToLower(s.SpanID),
					ParentSpanID: strings.ToLower(s.ParentSpanID), Name: s.Name, Kind: kind,
					Service: service, Scope: ss.Scope.Name, Attributes: attrs, Status: status,
				}
				for _, l := range s.Links {
					sp.Links = append(sp.Links, Link{TraceID: strings.ToLower(l.TraceID), SpanID: strings.ToLower(l.SpanID)})
				}
				out = append(out, sp)
			}
		}
	}
	return out, nil
}
