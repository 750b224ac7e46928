package keirotest

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/keiro-go/keiro/envelope"
)

// criteria is what Enqueued and Published have in common: the fields of an event a test
// names. Empty fields match anything.
type criteria struct {
	messageID, source, destination, key string
	noKey                               bool
	eventType                           string
	payload                             PayloadMatcher
	where                               func(envelope.Event) error
	status                              string // outbox rows only
}

// describe renders the criteria for a failure message.
func (c criteria) describe() string {
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, name+" "+strconv.Quote(v))
		}
	}
	add("message id", c.messageID)
	add("source", c.source)
	add("destination", c.destination)
	add("key", c.key)
	if c.noKey {
		parts = append(parts, "no key")
	}
	add("event type", c.eventType)
	add("status", c.status)
	if c.payload != nil {
		parts = append(parts, "payload "+c.payload.String())
	}
	if c.where != nil {
		parts = append(parts, "accepted by Where")
	}
	if len(parts) == 0 {
		return "any event"
	}
	return strings.Join(parts, ", ")
}

// mismatches lists how ev (and an outbox row's status) differ from the criteria; none means a
// match.
func (c criteria) mismatches(ev envelope.Event, status string) []string {
	var out []string
	field := func(name, want, got string) {
		if want != "" && want != got {
			out = append(out, fmt.Sprintf("%s is %q, want %q", name, got, want))
		}
	}
	field("message id", c.messageID, ev.MessageID)
	field("source", c.source, ev.Source)
	field("destination", c.destination, ev.Destination)
	switch {
	case c.key != "" && ev.Key == nil:
		out = append(out, fmt.Sprintf("it has no key, want key %q", c.key))
	case c.key != "":
		field("key", c.key, *ev.Key)
	case c.noKey && ev.Key != nil:
		out = append(out, fmt.Sprintf("key is %q, want no key", *ev.Key))
	}
	field("event type", c.eventType, ev.EventType)
	field("status", c.status, status)
	if c.payload != nil {
		if err := c.payload.MatchPayload(ev.Payload); err != nil {
			out = append(out, "payload: "+err.Error())
		}
	}
	if c.where != nil {
		if err := c.where(ev); err != nil {
			out = append(out, "Where: "+err.Error())
		}
	}
	return out
}

// summary renders an event on one line: destination, key, type and payload.
func summary(ev envelope.Event) string {
	key := "no key"
	if ev.Key != nil {
		key = "key " + strconv.Quote(*ev.Key)
	}
	return fmt.Sprintf("%s %s %s (message id %q, source %q) payload %s",
		ev.EventType, key, ev.Destination, ev.MessageID, ev.Source, showPayload(ev.Payload))
}

// showPayload renders a payload readably: compact JSON or text when it is printable, else its
// length.
func showPayload(p []byte) string {
	if len(p) == 0 {
		return "(empty)"
	}
	if !utf8.Valid(p) || strings.ContainsFunc(string(p), func(r rune) bool { return r < ' ' && r != '\n' && r != '\t' && r != '\r' }) {
		return fmt.Sprintf("(%d bytes, not text)", len(p))
	}
	return clip(compactJSON(p), 200)
}

// maxListed bounds the rows or records a failure message lists.
const maxListed = 20

// listing renders candidates for a failure message, each followed by what differs from the
// criteria (or "matches") when diffs is not nil.
func listing(n int, line func(i int) string, diffs func(i int) []string) string {
	var b strings.Builder
	for i := range min(n, maxListed) {
		fmt.Fprintf(&b, "\n    %d. %s", i+1, line(i))
		if diffs == nil {
			continue
		}
		if d := diffs(i); len(d) > 0 {
			fmt.Fprintf(&b, "\n       differs: %s", strings.Join(d, "; "))
		} else {
			b.WriteString("\n       matches")
		}
	}
	if n > maxListed {
		fmt.Fprintf(&b, "\n    … and %d more", n-maxListed)
	}
	return b.String()
}
