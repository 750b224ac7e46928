package keirotest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
)

// HeaderMatcher checks a record's Kafka headers, for RequirePublished and RequireDeadLettered.
// Build one with WithHeader, WithoutHeader, WithCorrelationID, WithCausationID,
// WithTraceParent, WithTraceID or WithSchemaID.
type HeaderMatcher interface {
	// MatchHeaders returns nil when headers match, else an error saying what differs.
	MatchHeaders(headers []kgo.RecordHeader) error
	// String describes what the matcher wants, for failure messages.
	String() string
}

// headerMatcher is the kit's HeaderMatcher: a header's value checked by match.
type headerMatcher struct {
	desc  string
	name  string
	want  string              // shown as the wanted value
	match func(v string) bool // nil: the header must be absent
	bad   error               // the matcher's own arguments are invalid
}

func (m headerMatcher) String() string { return m.desc }

func (m headerMatcher) MatchHeaders(hs []kgo.RecordHeader) error {
	v, ok := lastHeader(hs, m.name)
	switch {
	case m.match == nil && ok:
		return fmt.Errorf("header %q is %q, want none", m.name, v)
	case m.match == nil:
		return nil
	case !ok:
		return fmt.Errorf("it has no header %q, want %s", m.name, m.want)
	case !m.match(v):
		return fmt.Errorf("header %q is %q, want %s", m.name, v, m.want)
	}
	return nil
}

// check reports invalid arguments of the matcher, so that the test fails before reading.
func (m headerMatcher) check() error { return m.bad }

// WithHeader matches a record whose header name (the last one of that name) is value.
func WithHeader(name, value string) HeaderMatcher {
	m := headerMatcher{desc: fmt.Sprintf("header %s=%q", name, value), name: name, want: strconv.Quote(value),
		match: func(v string) bool { return v == value }}
	if name == "" {
		m.bad = fmt.Errorf("WithHeader: the header name is empty")
	}
	return m
}

// WithoutHeader matches a record that has no header name.
func WithoutHeader(name string) HeaderMatcher {
	m := headerMatcher{desc: fmt.Sprintf("no header %s", name), name: name}
	if name == "" {
		m.bad = fmt.Errorf("WithoutHeader: the header name is empty")
	}
	return m
}

// WithCorrelationID matches a record whose keiro-correlation-id header is the UUID id (in any
// case; the header is lowercase).
func WithCorrelationID(id string) HeaderMatcher {
	return uuidHeader("WithCorrelationID", envelope.HeaderCorrelationID, id)
}

// WithCausationID matches a record whose keiro-causation-id header is the UUID id.
func WithCausationID(id string) HeaderMatcher {
	return uuidHeader("WithCausationID", envelope.HeaderCausationID, id)
}

func uuidHeader(fn, name, id string) HeaderMatcher {
	u, err := envelope.ParseUUID(id)
	want := u.String()
	m := headerMatcher{desc: fmt.Sprintf("header %s=%q", name, want), name: name, want: strconv.Quote(want),
		match: func(v string) bool { return v == want }}
	if err != nil {
		m.bad = fmt.Errorf("%s(%q): not a UUID: %v", fn, id, err)
	}
	return m
}

var (
	traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)
	traceIDRE     = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

// WithTraceParent matches a record whose traceparent header is traceparent, a W3C value
// ("00-<trace id>-<parent id>-<flags>"). The relay continues the enqueueing transaction's trace
// with a send span of its own when tracing records, which gives the record a new parent id:
// match the trace with WithTraceID then.
func WithTraceParent(traceparent string) HeaderMatcher {
	m := headerMatcher{desc: fmt.Sprintf("header traceparent=%q", traceparent), name: envelope.HeaderTraceparent,
		want: strconv.Quote(traceparent), match: func(v string) bool { return v == traceparent }}
	if !traceparentRE.MatchString(traceparent) {
		m.bad = fmt.Errorf("WithTraceParent(%q): not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, lowercase)", traceparent)
	}
	return m
}

// WithTraceID matches a record whose traceparent header belongs to the trace traceID (32
// lowercase hex digits, as trace.TraceID.String gives it), whatever its parent span.
func WithTraceID(traceID string) HeaderMatcher {
	m := headerMatcher{desc: fmt.Sprintf("trace id %s", traceID), name: envelope.HeaderTraceparent,
		want: fmt.Sprintf("a traceparent of trace %s", traceID), match: func(v string) bool {
			parts := strings.Split(v, "-")
			return len(parts) == 4 && parts[1] == traceID
		}}
	if !traceIDRE.MatchString(traceID) {
		m.bad = fmt.Errorf("WithTraceID(%q): not a trace id (32 lowercase hex digits)", traceID)
	}
	return m
}

// WithSchemaID matches a record whose keiro-schema-id header (the registry's schema id) is id.
func WithSchemaID(id int64) HeaderMatcher {
	want := strconv.FormatInt(id, 10)
	return headerMatcher{desc: fmt.Sprintf("header %s=%s", envelope.HeaderSchemaID, want), name: envelope.HeaderSchemaID,
		want: strconv.Quote(want), match: func(v string) bool { return v == want }}
}

// lastHeader returns the value of the last header named key.
func lastHeader(hs []kgo.RecordHeader, key string) (string, bool) {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return string(hs[i].Value), true
		}
	}
	return "", false
}

// checkHeaderMatchers reports the first invalid matcher.
func checkHeaderMatchers(ms []HeaderMatcher) error {
	for i, m := range ms {
		if m == nil {
			return fmt.Errorf("header matcher %d is nil", i+1)
		}
		if c, ok := m.(interface{ check() error }); ok {
			if err := c.check(); err != nil {
				return err
			}
		}
	}
	return nil
}

// headerMismatches lists how hs differs from ms.
func headerMismatches(hs []kgo.RecordHeader, ms []HeaderMatcher) []string {
	var out []string
	for _, m := range ms {
		if err := m.MatchHeaders(hs); err != nil {
			out = append(out, err.Error())
		}
	}
	return out
}

// describeHeaders renders ms for a failure message's "want" line.
func describeHeaders(ms []HeaderMatcher) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = m.String()
	}
	return strings.Join(parts, ", ")
}

// showHeaders renders a record's headers for a failure message: every header, on one line.
func showHeaders(hs []kgo.RecordHeader) string {
	if len(hs) == 0 {
		return "(none)"
	}
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = h.Key + "=" + clip(strconv.Quote(string(h.Value)), 120)
	}
	return strings.Join(parts, " ")
}
