package keirotest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"sort"
	"strings"
)

// PayloadMatcher checks an event's payload. Build one with JSONSubset, JSONEqual, PayloadFunc
// or JSONFunc.
type PayloadMatcher interface {
	// MatchPayload returns nil when payload matches, else an error saying what differs.
	MatchPayload(payload []byte) error
	// String describes what the matcher wants, for failure messages.
	String() string
}

// JSONSubset matches a JSON payload that contains want: every member of a wanted object must
// be present with a matching value (other members are ignored), arrays must have the same
// length with matching elements in order, and scalars must be equal (numbers by value, so 3000
// matches 3000.0). want is JSON text when it is a string, []byte or json.RawMessage, and is
// encoded with encoding/json otherwise (a map, or a struct whose fields are tagged omitempty
// so that only the fields set are compared).
func JSONSubset(want any) PayloadMatcher {
	return jsonMatcher{want: want, subset: true}
}

// JSONEqual matches a JSON payload equal to want (object member order and spacing ignored,
// numbers compared by value). want is read as for JSONSubset.
func JSONEqual(want any) PayloadMatcher {
	return jsonMatcher{want: want}
}

// PayloadFunc matches a payload for which fn returns nil; the error fn returns is shown in
// failure messages, so make it say what differs.
func PayloadFunc(fn func(payload []byte) error) PayloadMatcher {
	return funcMatcher{desc: "a payload accepted by the PayloadFunc", fn: fn}
}

// JSONFunc decodes the payload into a T with encoding/json and matches when fn returns nil.
// A payload that does not decode does not match.
func JSONFunc[T any](fn func(T) error) PayloadMatcher {
	var zero T
	return funcMatcher{desc: fmt.Sprintf("a JSON %T accepted by the JSONFunc", zero), fn: func(p []byte) error {
		var v T
		if err := json.Unmarshal(p, &v); err != nil {
			return fmt.Errorf("payload does not decode into %T: %v", v, err)
		}
		return fn(v)
	}}
}

type funcMatcher struct {
	desc string
	fn   func([]byte) error
}

func (m funcMatcher) MatchPayload(p []byte) error { return m.fn(p) }
func (m funcMatcher) String() string              { return m.desc }

type jsonMatcher struct {
	want   any
	subset bool
}

// wantJSON returns the wanted value as JSON text.
func (m jsonMatcher) wantJSON() ([]byte, error) {
	switch w := m.want.(type) {
	case string:
		return []byte(w), nil
	case []byte:
		return w, nil
	case json.RawMessage:
		return w, nil
	}
	return json.Marshal(m.want)
}

func (m jsonMatcher) String() string {
	text, err := m.wantJSON()
	desc := "JSON equal to "
	if m.subset {
		desc = "JSON containing "
	}
	if err != nil {
		return desc + fmt.Sprintf("%#v", m.want)
	}
	return desc + compactJSON(text)
}

func (m jsonMatcher) MatchPayload(p []byte) error {
	text, err := m.wantJSON()
	if err != nil {
		return fmt.Errorf("the wanted value cannot be encoded as JSON: %v", err)
	}
	want, err := decodeJSON(text)
	if err != nil {
		return fmt.Errorf("the wanted value is not valid JSON (fix the test): %v", err)
	}
	got, err := decodeJSON(p)
	if err != nil {
		return fmt.Errorf("payload is not JSON: %v", err)
	}
	var diffs []string
	compareJSON("$", want, got, m.subset, &diffs)
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(diffs, "; "))
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("more than one JSON value")
	}
	return v, nil
}

// compareJSON appends to diffs what differs between want and got below path.
func compareJSON(path string, want, got any, subset bool, diffs *[]string) {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			*diffs = append(*diffs, fmt.Sprintf("%s is %s, want an object", path, show(got)))
			return
		}
		for _, k := range sortedKeys(w) {
			gv, ok := g[k]
			if !ok {
				*diffs = append(*diffs, fmt.Sprintf("%s.%s is missing, want %s", path, k, show(w[k])))
				continue
			}
			compareJSON(path+"."+k, w[k], gv, subset, diffs)
		}
		if !subset {
			for _, k := range sortedKeys(g) {
				if _, ok := w[k]; !ok {
					*diffs = append(*diffs, fmt.Sprintf("%s.%s is %s, not wanted", path, k, show(g[k])))
				}
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok {
			*diffs = append(*diffs, fmt.Sprintf("%s is %s, want an array", path, show(got)))
			return
		}
		if len(g) != len(w) {
			*diffs = append(*diffs, fmt.Sprintf("%s has %d elements, want %d", path, len(g), len(w)))
			return
		}
		for i := range w {
			compareJSON(fmt.Sprintf("%s[%d]", path, i), w[i], g[i], subset, diffs)
		}
	case json.Number:
		g, ok := got.(json.Number)
		if !ok || !sameNumber(w, g) {
			*diffs = append(*diffs, fmt.Sprintf("%s is %s, want %s", path, show(got), w))
		}
	default: // string, bool, nil
		if want != got {
			*diffs = append(*diffs, fmt.Sprintf("%s is %s, want %s", path, show(got), show(want)))
		}
	}
}

func sameNumber(a, b json.Number) bool {
	if a == b {
		return true
	}
	x, ok1 := new(big.Rat).SetString(string(a))
	y, ok2 := new(big.Rat).SetString(string(b))
	return ok1 && ok2 && x.Cmp(y) == 0
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// show renders a decoded JSON value compactly, cut to a readable length.
func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return clip(string(b), 80)
}

// compactJSON renders JSON text on one line, or the text itself if it is not JSON.
func compactJSON(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(b)
	}
	return buf.String()
}

// clip cuts s to at most n runes.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
