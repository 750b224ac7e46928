package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
)

// MaxSearchTermBytes bounds the search term.
const MaxSearchTermBytes = 512

// SearchAnswer answers GET /api/v1/search?q=: the outbox rows and the inbox messages that an
// identifier names exactly.
type SearchAnswer struct {
	// Query is the term searched for, trimmed.
	Query string `json:"query"`
	// Outbox lists the outbox rows, in any status, whose outbox id, message id, key, event type
	// or source is the term, newest first; null when the outbox is not served here.
	Outbox []OutboxHit `json:"outbox"`
	// OutboxMore reports that more outbox rows matched than the page holds.
	OutboxMore bool `json:"outbox_more,omitempty"`
	// Inbox lists the consumer's inbox rows, completed or failed, whose source, dedupe key,
	// message id, key or event type is the term, newest received first; null when the inbox
	// is not served here.
	Inbox []InboxHit `json:"inbox"`
	// InboxMore reports that more inbox rows matched than the page holds.
	InboxMore bool `json:"inbox_more,omitempty"`
}

// OutboxHit is an outbox row found by a search.
type OutboxHit struct {
	OutboxRow
	// Matched names the fields equal to the term: outbox_id, message_id, key, event_type, source.
	Matched []string `json:"matched"`
}

// InboxHit is an inbox row found by a search.
type InboxHit struct {
	InboxEntry
	// Key is the event's key, if it had one.
	Key *string `json:"key"`
	// Matched names the fields equal to the term: source, dedupe_key, message_id, key, event_type.
	Matched []string `json:"matched"`
}

// searchTerm reads ?q=: trimmed, at most MaxSearchTermBytes.
func searchTerm(r *http.Request) (string, error) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if len(q) > MaxSearchTermBytes {
		return "", fmt.Errorf("the search term is %d bytes; search for one identifier of at most %d bytes", len(q), MaxSearchTermBytes)
	}
	return q, nil
}

// search finds term in the outbox and the inbox, limit rows of each at most.
func (c *Console) search(ctx context.Context, term string, limit int) (SearchAnswer, error) {
	ans := SearchAnswer{Query: term}
	if c.cfg.Outbox != nil {
		ans.Outbox = []OutboxHit{}
		rows, err := c.outbox.SearchOutbox(ctx, c.cfg.Outbox.Pool,
			outbox.SearchOptions{Term: term, Limit: limit + 1, PayloadBytes: DefaultPreviewBytes})
		if err != nil {
			return ans, err
		}
		if id, err := envelope.ParseUUID(term); err == nil {
			switch row, err := c.outbox.Lookup(ctx, c.cfg.Outbox.Pool, id); {
			case err == nil:
				rows = append([]outbox.Row{row}, rows...)
			case !errors.Is(err, outbox.ErrNotFound):
				return ans, err
			}
		}
		seen := map[string]bool{}
		for _, row := range rows {
			o := outboxRowOf(row, DefaultPreviewBytes)
			if seen[o.OutboxID] {
				continue
			}
			seen[o.OutboxID] = true
			ans.Outbox = append(ans.Outbox, OutboxHit{OutboxRow: o, Matched: matched(term,
				"outbox_id", o.OutboxID, "message_id", o.MessageID, "key", derefOr(o.Key, ""), "event_type", o.EventType, "source", o.Source)})
		}
		if len(ans.Outbox) > limit {
			ans.Outbox, ans.OutboxMore = ans.Outbox[:limit], true
		}
	}
	if c.cfg.Inbox != nil {
		ans.Inbox = []InboxHit{}
		entries, err := c.inbox.Search(ctx, c.cfg.Inbox.Pool,
			inbox.SearchOptions{Term: term, Limit: limit + 1, PayloadBytes: DefaultPreviewBytes})
		if err != nil {
			return ans, err
		}
		if len(entries) > limit {
			entries, ans.InboxMore = entries[:limit], true
		}
		for _, e := range entries {
			h := InboxHit{InboxEntry: c.inboxEntry(e, DefaultPreviewBytes), Key: e.Delivery.Event.Key}
			h.Matched = matched(term, "source", h.Source, "dedupe_key", h.DedupeKey, "message_id", h.MessageID,
				"key", derefOr(h.Key, ""), "event_type", h.EventType)
			ans.Inbox = append(ans.Inbox, h)
		}
	}
	return ans, nil
}

// matched names the fields (name, value pairs) whose value is term.
func matched(term string, fields ...string) []string {
	out := []string{}
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i+1] == term {
			out = append(out, fields[i])
		}
	}
	return out
}

// searchData is the search page's content.
type searchData struct {
	Query  string
	Answer *SearchAnswer
}

func (c *Console) pageSearch(w http.ResponseWriter, r *http.Request) {
	q, err := searchTerm(r)
	if err != nil {
		c.pageError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	d := searchData{Query: q}
	if q != "" {
		ans, err := c.search(r.Context(), q, DefaultPageSize)
		if err != nil {
			c.serverError(w, r, err)
			return
		}
		d.Answer = &ans
	}
	c.render(w, r, http.StatusOK, "search", "Find a message", "search", d)
}

func (c *Console) apiSearch(w http.ResponseWriter, r *http.Request) {
	q, err := searchTerm(r)
	if err == nil && q == "" {
		err = errors.New("say what to find: ?q= a message id, key, event type or source (an outbox id too)")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	limit, err := pageSize(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ans, err := c.search(r.Context(), q, limit)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ans)
}

// needRows answers 404 when neither the outbox nor the inbox is configured.
func (c *Console) needRows(h http.HandlerFunc) http.HandlerFunc {
	if c.cfg.Outbox != nil || c.cfg.Inbox != nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, strings.HasPrefix(r.URL.Path, "/api/"), http.StatusNotFound,
			"search reads the outbox and the inbox, and neither is configured on this server (the relay serves the outbox, the consumer the inbox)")
	}
}
