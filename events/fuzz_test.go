package events_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/events"
)

// FuzzStreamName checks the stream-name rules against their definition on arbitrary input.
func FuzzStreamName(f *testing.F) {
	for _, s := range []string{"order-1", "wf:fulfillment-a-b", "order", "-1", "$all-1", "a b-1", "a-", "a- ", "é-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := events.ValidateStreamName(s)
		cat, id, found := strings.Cut(s, "-")
		if err == nil {
			if !found || cat == "" || cat == events.ReservedCategory || strings.TrimSpace(id) == "" {
				t.Fatalf("%q accepted", s)
			}
			if events.Category(s) != cat || events.ValidateCategory(cat) != nil {
				t.Fatalf("%q: category %q", s, events.Category(s))
			}
		} else if found && cat != "" && events.ValidateCategory(cat) == nil && strings.TrimSpace(id) != "" {
			t.Fatalf("%q rejected: %v", s, err)
		}
	})
}

// FuzzJSONCodecDecode feeds stored bytes of any shape to the codec: it must return an event or
// an error, never panic, and a decoded event must re-encode.
func FuzzJSONCodecDecode(f *testing.F) {
	c := events.NewJSONCodec[counterEvent]()
	if err := events.RegisterJSON[Added](c, "Added", 2); err != nil {
		f.Fatal(err)
	}
	if err := c.Upcast("Added", 1, func(b json.RawMessage) (json.RawMessage, error) { return b, nil }); err != nil {
		f.Fatal(err)
	}
	f.Add("Added", int32(1), []byte(`{"n":1}`))
	f.Add("Added", int32(2), []byte(`{"n":"x"}`))
	f.Add("Other", int32(1), []byte(`{}`))
	f.Add("Added", int32(3), []byte(`[]`))
	f.Fuzz(func(t *testing.T, typ string, version int32, data []byte) {
		e, err := c.Decode(events.RecordedEvent{Type: typ, SchemaVersion: version, Data: data})
		if err != nil {
			return
		}
		if _, err := c.Encode(e); err != nil {
			t.Fatalf("decoded %#v does not re-encode: %v", e, err)
		}
	})
}
