package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

// jsonLines decodes every line of out as a JSON object; t fails on a line that is not one.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var docs []map[string]any
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line is not JSON: %q (%v)\nall output:\n%s", l, err, out)
		}
		docs = append(docs, m)
	}
	return docs
}

// With --log-format=json the final error report is JSON too: a command's failure and every
// configuration problem, one JSON line each.
func TestJSONErrorReports(t *testing.T) {
	var out bytes.Buffer
	code := app(&out).Run(context.Background(), &testGrammar{}, []string{"--log-format=json", "other", "--fail"})
	if code != 7 {
		t.Fatalf("exit code %d, want 7:\n%s", code, out.String())
	}
	docs := jsonLines(t, out.String())
	if len(docs) != 1 || docs[0]["level"] != "ERROR" || docs[0]["msg"] != "boom" || docs[0]["app"] != "t" {
		t.Fatalf("error report: %v", docs)
	}

	out.Reset()
	code = app(&out).Run(context.Background(), &testGrammar{}, []string{"--log-format=json", "run", "--batch-size=0", "--lease=-1s"})
	if code != cli.ExitUsage {
		t.Fatalf("exit code %d, want %d:\n%s", code, cli.ExitUsage, out.String())
	}
	docs = jsonLines(t, out.String())
	if len(docs) != 2 {
		t.Fatalf("want one JSON line per problem, got %v", docs)
	}
	for _, d := range docs {
		if d["level"] != "ERROR" || !strings.HasPrefix(d["msg"].(string), "--") {
			t.Fatalf("problem line: %v", d)
		}
	}

	out.Reset() // the text format keeps the classic report
	app(&out).Run(context.Background(), &testGrammar{}, []string{"other", "--fail"})
	if out.String() != "t: error: boom\n" {
		t.Fatalf("text report: %q", out.String())
	}
}

// A line logged with a span's context carries its trace_id and span_id; others do not.
func TestLogsCarryTraceIDs(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	for _, format := range []string{"json", "text"} {
		var out bytes.Buffer
		f := &cli.LogFlags{LogLevel: "info", LogFormat: format}
		log, err := f.Logger(&out)
		if err != nil {
			t.Fatal(err)
		}
		ctx, span := tp.Tracer("t").Start(context.Background(), "work")
		sc := span.SpanContext()
		log.With("component", "x").InfoContext(ctx, "inside")
		span.End()
		log.Info("outside")
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("%s: %q", format, out.String())
		}
		if format == "json" {
			docs := jsonLines(t, out.String())
			if docs[0]["trace_id"] != sc.TraceID().String() || docs[0]["span_id"] != sc.SpanID().String() || docs[0]["component"] != "x" {
				t.Fatalf("json line inside the span: %v", docs[0])
			}
			if _, ok := docs[1]["trace_id"]; ok {
				t.Fatalf("json line outside a span has a trace id: %v", docs[1])
			}
			continue
		}
		if !strings.Contains(lines[0], "trace_id="+sc.TraceID().String()) || !strings.Contains(lines[0], "span_id="+sc.SpanID().String()) {
			t.Fatalf("text line inside the span: %q", lines[0])
		}
		if strings.Contains(lines[1], "trace_id") {
			t.Fatalf("text line outside a span: %q", lines[1])
		}
	}
}
