package envelope_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

func TestValidate(t *testing.T) {
	if err := (&envelope.Event{}).Validate(); err == nil {
		t.Fatal("zero event is valid")
	}
	valid := sample(t)
	if err := valid.Validate(); err != nil {
		t.Fatalf("sample: %v", err)
	}
	if m := minimal(); m.Validate() != nil {
		t.Fatalf("minimal: %v", m.Validate())
	}
	cases := []struct {
		name string
		edit func(*envelope.Event)
		want []string // substrings, one per expected problem
	}{
		{"empty message id", func(e *envelope.Event) { e.MessageID = "" }, []string{"MessageID is required"}},
		{"empty source", func(e *envelope.Event) { e.Source = "" }, []string{"Source is required"}},
		{"empty destination", func(e *envelope.Event) { e.Destination = "" }, []string{"Destination is required"}},
		{"empty event type", func(e *envelope.Event) { e.EventType = "" }, []string{"EventType is required"}},
		{"empty content type", func(e *envelope.Event) { e.ContentType = "" }, []string{"ContentType is required"}},
		{"message id too long", func(e *envelope.Event) { e.MessageID = strings.Repeat("x", envelope.MaxMessageIDLen+1) }, []string{"MessageID is 257 bytes"}},
		{"message id at limit", func(e *envelope.Event) { e.MessageID = strings.Repeat("x", envelope.MaxMessageIDLen) }, nil},
		{"topic with slash", func(e *envelope.Event) { e.Destination = "billing/orders" }, []string{`Destination "billing/orders": is not a legal Kafka topic`}},
		{"topic with space", func(e *envelope.Event) { e.Destination = "billing orders" }, []string{"Destination"}},
		{"topic dot", func(e *envelope.Event) { e.Destination = "." }, []string{"Destination"}},
		{"topic dotdot", func(e *envelope.Event) { e.Destination = ".." }, []string{"Destination"}},
		{"topic dots in name ok", func(e *envelope.Event) { e.Destination = "..." }, nil},
		{"topic too long", func(e *envelope.Event) { e.Destination = strings.Repeat("a", 250) }, []string{"250 characters, longer than Kafka's 249"}},
		{"topic at limit", func(e *envelope.Event) { e.Destination = strings.Repeat("a", 249) }, nil},
		{"negative schema version", func(e *envelope.Event) { e.SchemaVersion = -1 }, []string{"SchemaVersion -1 is negative"}},
		{"bad attributes", func(e *envelope.Event) { e.Attributes = json.RawMessage(`{"a":`) }, []string{"Attributes is not valid JSON"}},
		{"empty attributes", func(e *envelope.Event) { e.Attributes = json.RawMessage{} }, []string{"Attributes is not valid JSON"}},
		{"zero occurred at", func(e *envelope.Event) { e.OccurredAt = time.Time{} }, []string{"OccurredAt is required"}},
		{"occurred at year 10000", func(e *envelope.Event) { e.OccurredAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, []string{"OccurredAt year 10000"}},
		{"traceparent garbage", func(e *envelope.Event) { e.TraceContext.Traceparent = "garbage" }, []string{"TraceContext.Traceparent"}},
		{"traceparent uppercase", func(e *envelope.Event) {
			e.TraceContext.Traceparent = "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"
		}, []string{"TraceContext.Traceparent"}},
		{"traceparent zero trace id", func(e *envelope.Event) {
			e.TraceContext.Traceparent = "00-00000000000000000000000000000000-b7ad6b7169203331-01"
		}, []string{"TraceContext.Traceparent"}},
		{"traceparent zero span id", func(e *envelope.Event) {
			e.TraceContext.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"
		}, []string{"TraceContext.Traceparent"}},
		{"traceparent version ff", func(e *envelope.Event) {
			e.TraceContext.Traceparent = "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		}, []string{"TraceContext.Traceparent"}},
		{"traceparent v00 with suffix", func(e *envelope.Event) {
			e.TraceContext.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-xx"
		}, []string{"TraceContext.Traceparent"}},
		{"traceparent future version with suffix ok", func(e *envelope.Event) {
			e.TraceContext.Traceparent = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-xx"
		}, nil},
		{"invalid utf-8 event type", func(e *envelope.Event) { e.EventType = "a\xffb" }, []string{"EventType is not valid UTF-8"}},
		{"invalid utf-8 key", func(e *envelope.Event) { e.Key = ptr("\xc3") }, []string{"Key is not valid UTF-8"}},
		{"headers too big", func(e *envelope.Event) {
			e.Attributes = json.RawMessage(`"` + strings.Repeat("a", envelope.MaxHeaderBytes) + `"`)
		}, []string{"headers total"}},
		{"several problems at once", func(e *envelope.Event) {
			e.MessageID, e.Source, e.Destination, e.SchemaVersion = "", "", "a b", -2
		}, []string{"MessageID is required", "Source is required", "Destination", "SchemaVersion -2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := sample(t)
			c.edit(&e)
			err := e.Validate()
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected problems: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted the event")
			}
			var joined interface{ Unwrap() []error }
			if !errors.As(err, &joined) || len(joined.Unwrap()) != len(c.want) {
				t.Fatalf("want %d problems, got: %v", len(c.want), err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
