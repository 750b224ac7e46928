package jaeger_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/keirotest/testenv/internal/jaeger"
)

// TestRoundTrip starts Jaeger, exports a small trace over each OTLP protocol with the SDK, and
// reads it back from the query API: names, kinds, parents, links, attribute types, status and
// the resource's service name survive the trip. An unknown trace is ErrTraceNotFound.
func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	j, err := jaeger.Start(ctx, jaeger.Config{})
	require.NoError(t, err)
	t.Cleanup(j.Close)

	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			var exp sdktrace.SpanExporter
			if protocol == "http" {
				exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(j.OTLPHTTP+"/v1/traces"))
			} else {
				exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(j.OTLPGRPC), otlptracegrpc.WithInsecure())
			}
			require.NoError(t, err)
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
				sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "svc-"+protocol))))
			defer func() { _ = tp.Shutdown(ctx) }()

			tr := tp.Tracer("roundtrip")
			pctx, parent := tr.Start(ctx, "parent", trace.WithSpanKind(trace.SpanKindProducer))
			_, other := tr.Start(ctx, "other")
			other.End()
			_, child := tr.Start(pctx, "child", trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithLinks(trace.Link{SpanContext: other.SpanContext()}),
				trace.WithAttributes(attribute.String("s", "v"), attribute.Int64("n", 42), attribute.Bool("b", true),
					attribute.Float64("f", 1.5), attribute.StringSlice("a", []string{"x", "y"})))
			child.RecordError(errors.New("boom"))
			child.SetStatus(codes.Error, "boom")
			child.End()
			parent.End()

			traceID := parent.SpanContext().TraceID().String()
			var spans []jaeger.Span
			deadline := time.Now().Add(time.Minute)
			for len(spans) < 2 {
				spans, err = j.Trace(ctx, traceID)
				if err != nil && !errors.Is(err, jaeger.ErrTraceNotFound) {
					t.Fatal(err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("trace %s: %d spans after a minute", traceID, len(spans))
				}
				time.Sleep(50 * time.Millisecond) // the collector's batch, then storage
			}
			byName := map[string]jaeger.Span{}
			for _, s := range spans {
				byName[s.Name] = s
			}
			p, c := byName["parent"], byName["child"]
			require.Equal(t, "producer", p.Kind)
			require.Equal(t, "svc-"+protocol, p.Service)
			require.Equal(t, "roundtrip", p.Scope)
			require.Empty(t, p.ParentSpanID)
			require.Equal(t, "consumer", c.Kind)
			require.Equal(t, p.SpanID, c.ParentSpanID)
			require.Equal(t, []jaeger.Link{{TraceID: other.SpanContext().TraceID().String(), SpanID: other.SpanContext().SpanID().String()}}, c.Links)
			require.Equal(t, "error", c.Status)
			require.Equal(t, "v", c.Attributes["s"])
			require.Equal(t, int64(42), c.Attributes["n"])
			require.Equal(t, true, c.Attributes["b"])
			require.Equal(t, 1.5, c.Attributes["f"])
			require.Equal(t, []any{"x", "y"}, c.Attributes["a"])
		})
	}

	_, err = j.Trace(ctx, "0123456789abcdef0123456789abcdef")
	require.ErrorIs(t, err, jaeger.ErrTraceNotFound)
}

// TestDecode reads the query API's answer in both of protobuf's JSON spellings of OTLP's enums
// and 64-bit integers, and refuses values it cannot read rather than guessing.
func TestDecode(t *testing.T) {
	doc := `{"result":{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},
	  "scopeSpans":[{"scope":{"name":"sc"},"spans":[
	    {"traceId":"0000000000000000000000000000000A","spanId":"0000000000000002","name":"a","kind":3,"status":{"code":1},
	     "attributes":[{"key":"n","value":{"intValue":"7"}},{"key":"m","value":{"intValue":8}}]},
	    {"traceId":"0000000000000000000000000000000a","spanId":"0000000000000003","parentSpanId":"0000000000000002",
	     "name":"b","kind":"SPAN_KIND_CONSUMER","status":{"code":"STATUS_CODE_ERROR"},"links":[{"traceId":"0A","spanId":"0B"}]},
	    {"traceId":"0000000000000000000000000000000a","spanId":"0000000000000004","name":"c","kind":"SPAN_KIND_UNSPECIFIED"}
	  ]}]}]}}`
	spans, err := jaeger.DecodeTrace([]byte(doc))
	require.NoError(t, err)
	require.Len(t, spans, 3)
	require.Equal(t, jaeger.Span{TraceID: "0000000000000000000000000000000a", SpanID: "0000000000000002", Name: "a",
		Kind: "client", Service: "svc", Scope: "sc", Status: "ok", Attributes: map[string]any{"n": int64(7), "m": int64(8)}}, spans[0])
	require.Equal(t, "consumer", spans[1].Kind)
	require.Equal(t, "error", spans[1].Status)
	require.Equal(t, []jaeger.Link{{TraceID: "0a", SpanID: "0b"}}, spans[1].Links)
	require.Equal(t, "", spans[2].Kind)
	require.Equal(t, "unset", spans[2].Status)

	for name, bad := range map[string]string{
		"kind out of range": `{"result":{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"1","kind":9}]}]}]}}`,
		"unknown kind name": `{"result":{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"1","kind":"SPAN_KIND_BOGUS"}]}]}]}}`,
		"kind of a type":    `{"result":{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"1","kind":true}]}]}]}}`,
		"bad int value":     `{"result":{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"1","attributes":[{"key":"n","value":{"intValue":"x"}}]}]}]}]}}`,
		"not JSON":          `{"result":`,
	} {
		_, err := jaeger.DecodeTrace([]byte(bad))
		require.Error(t, err, name)
	}
	var anyDoc map[string]any
	require.NoError(t, json.Unmarshal([]byte(doc), &anyDoc), "the fixture itself is JSON")
}

// FuzzDecode: whatever bytes the query API answers, decoding returns spans or an error, never
// a panic.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"result":{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"1","kind":2,"attributes":[{"key":"a","value":{"arrayValue":{"values":[{"intValue":"1"}]}}}]}]}]}]}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = jaeger.DecodeTrace(b)
	})
}
