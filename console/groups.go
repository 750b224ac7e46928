package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/keiro-go/keiro/failure"
)

// MaxGroups is the most failure groups a listing returns.
const MaxGroups = 200

// FailureGroups answers GET /api/v1/outbox/groups and GET /api/v1/inbox/groups.
type FailureGroups struct {
	// Groups are the groups, largest first.
	Groups []FailureGroup `json:"groups"`
}

// FailureGroup is the failed rows that share an error class and a normalised message (UUIDs,
// long hex runs and numbers replaced by <id>, <hex> and <n>).
type FailureGroup struct {
	// Class is the error class: dead, or "rejected: CODE" (outbox); poisoned or retrying (inbox).
	Class string `json:"class"`
	// Message is the normalised last error (at most 500 characters).
	Message string `json:"message"`
	// Count is the number of rows in the group.
	Count int64 `json:"count"`
	// First and Last are the oldest and newest failure of the group.
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
	// Example is one row's last error as it was written.
	Example string `json:"example"`
	// Where lists up to 5 destinations (outbox) or sources (inbox) of the group's rows.
	Where []string `json:"where"`
	// EventTypes lists up to 5 event types of the group's rows.
	EventTypes []string `json:"event_types"`
}

// Ref is the group as an action names it.
func (g FailureGroup) Ref() GroupRef { return GroupRef{Class: g.Class, Message: g.Message} }

// GroupRef names a failure group: its class and normalised message, as listed.
type GroupRef struct {
	// Class is the group's error class.
	Class string `json:"class"`
	// Message is the group's normalised message.
	Message string `json:"message"`
}

func (g GroupRef) validate() error {
	if g.Class == "" {
		return errors.New("class is required (a group's class and message, as GET …/groups lists them)")
	}
	return nil
}

func (c *Console) readOutboxGroups(ctx context.Context) (FailureGroups, error) {
	return failureGroups(c.outbox.FailureGroups(ctx, c.cfg.Outbox.Pool, MaxGroups))
}

func (c *Console) readInboxGroups(ctx context.Context) (FailureGroups, error) {
	return failureGroups(c.inbox.FailureGroups(ctx, c.cfg.Inbox.Pool, MaxGroups))
}

// failureGroups is the answer of a listing of failure groups.
func failureGroups(gs []failure.Group, err error) (FailureGroups, error) {
	out := FailureGroups{Groups: make([]FailureGroup, 0, len(gs))}
	if err != nil {
		return out, err
	}
	for _, g := range gs {
		out.Groups = append(out.Groups, FailureGroup{Class: g.Class, Message: g.Message, Count: g.Count, First: g.First, Last: g.Last,
			Example: g.Example, Where: g.Where, EventTypes: g.EventTypes})
	}
	return out, nil
}

// outboxGroupIDs lists up to MaxSelection outbox ids of group g, newest first; more reports
// that the group has more rows.
func (c *Console) outboxGroupIDs(ctx context.Context, g GroupRef) (ids []string, more bool, err error) {
	uuids, err := c.outbox.FailureGroupIDs(ctx, c.cfg.Outbox.Pool, g.Class, g.Message, MaxSelection+1)
	if err != nil {
		return nil, false, err
	}
	for _, u := range uuids {
		ids = append(ids, u.String())
	}
	if len(ids) > MaxSelection {
		return ids[:MaxSelection], true, nil
	}
	return ids, false, nil
}

// inboxGroupKeys lists up to MaxSelection keys of group g, oldest failure first.
func (c *Console) inboxGroupKeys(ctx context.Context, g GroupRef) (keys []RetryKey, more bool, err error) {
	ks, err := c.inbox.FailureGroupKeys(ctx, c.cfg.Inbox.Pool, g.Class, g.Message, MaxSelection+1)
	if err != nil {
		return nil, false, err
	}
	for _, k := range ks {
		keys = append(keys, RetryKey{Source: k.Source, DedupeKey: k.DedupeKey})
	}
	if len(keys) > MaxSelection {
		return keys[:MaxSelection], true, nil
	}
	return keys, false, nil
}

// GroupRequeueAnswer answers POST /api/v1/outbox/groups/requeue.
type GroupRequeueAnswer struct {
	RequeueAnswer
	// Remaining reports that the group had more than MaxSelection rows: call again.
	Remaining bool `json:"remaining,omitempty"`
}

func (c *Console) apiOutboxGroupRequeue(w http.ResponseWriter, r *http.Request) {
	var g GroupRef
	if status, msg := decodeBody(r, &g); status != 0 {
		writeError(w, status, msg)
		return
	}
	if err := g.validate(); err != nil {
		writeError(w, http.StatusBadRequest, "requeue a group: "+err.Error())
		return
	}
	ids, more, err := c.outboxGroupIDs(r.Context(), g)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	if len(ids) == 0 {
		writeError(w, http.StatusNotFound, "no dead or rejected row is in this group (any more): list the groups again")
		return
	}
	ans, err := c.requeue(r, RequeueRequest{IDs: ids})
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, GroupRequeueAnswer{RequeueAnswer: ans, Remaining: more})
}

func (c *Console) apiInboxGroupRetry(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Inbox.Handler == nil {
		writeError(w, http.StatusNotImplemented, "retry is not available: the console has no handler (InboxConfig.Handler)")
		return
	}
	var g GroupRef
	if status, msg := decodeBody(r, &g); status != 0 {
		writeError(w, status, msg)
		return
	}
	if err := g.validate(); err != nil {
		writeError(w, http.StatusBadRequest, "retry a group: "+err.Error())
		return
	}
	keys, more, err := c.inboxGroupKeys(r.Context(), g)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	if len(keys) == 0 {
		writeError(w, http.StatusNotFound, "no failed message is in this group (any more): list the groups again")
		return
	}
	ans, err := c.retry(r, RetryRequest{Keys: keys})
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	ans.Remaining = more
	writeJSON(w, http.StatusOK, ans)
}

// groupsData is the failure-group page's content.
type groupsData struct {
	// Kind is "outbox" or "inbox".
	Kind   string
	Groups FailureGroups
	// Consumer is the inbox consumer (inbox groups).
	Consumer string
}

func (c *Console) pageOutboxGroups(w http.ResponseWriter, r *http.Request) {
	g, err := c.readOutboxGroups(r.Context())
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "groups", "Outbox: dead and rejected rows by error", "outbox", groupsData{Kind: "outbox", Groups: g})
}

func (c *Console) pageInboxGroups(w http.ResponseWriter, r *http.Request) {
	g, err := c.readInboxGroups(r.Context())
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "groups", "Inbox: failed messages by error", "inbox",
		groupsData{Kind: "inbox", Groups: g, Consumer: c.cfg.Inbox.Consumer})
}

// formGroup reads the group a form names.
func formGroup(r *http.Request) (GroupRef, error) {
	g := GroupRef{Class: r.PostFormValue("class"), Message: r.PostFormValue("message")}
	return g, g.validate()
}

// pageOutboxGroupRequeue answers the requeue confirmation of a group's rows (the newest
// MaxSelection), whose confirmed form is the ordinary requeue of those ids.
func (c *Console) pageOutboxGroupRequeue(w http.ResponseWriter, r *http.Request) {
	g, err := formGroup(r)
	if err != nil {
		c.pageError(w, r, http.StatusBadRequest, "Requeue a group: "+err.Error()+".")
		return
	}
	ids, _, err := c.outboxGroupIDs(r.Context(), g)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	if len(ids) == 0 {
		c.pageError(w, r, http.StatusNotFound, "No dead or rejected row is in this group any more: open the groups again.")
		return
	}
	r.PostForm = url.Values{"id": ids}
	c.pageOutboxRequeue(w, r)
}

// pageInboxGroupRetry answers the retry confirmation of a group's messages (the oldest
// MaxSelection), whose confirmed form is the ordinary retry of those keys.
func (c *Console) pageInboxGroupRetry(w http.ResponseWriter, r *http.Request) {
	g, err := formGroup(r)
	if err != nil {
		c.pageError(w, r, http.StatusBadRequest, "Retry a group: "+err.Error()+".")
		return
	}
	keys, _, err := c.inboxGroupKeys(r.Context(), g)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	if len(keys) == 0 {
		c.pageError(w, r, http.StatusNotFound, "No failed message is in this group any more: open the groups again.")
		return
	}
	v := url.Values{}
	for _, k := range keys {
		v.Add("key", k.Value())
	}
	r.PostForm = v
	c.pageInboxRetry(w, r)
}

// groupQuery is the list filter of a group's "where" (a destination or a source).
func groupQuery(kind, where string) string {
	if kind == "outbox" {
		return "/console/outbox?" + url.Values{"destination": {where}}.Encode()
	}
	return "/console/inbox?" + url.Values{"source": {where}}.Encode()
}
