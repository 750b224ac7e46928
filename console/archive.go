package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
)

// OutboxArchiveRequest is the body of POST /api/v1/outbox/archive: ids, or a failure group.
type OutboxArchiveRequest struct {
	// IDs are the dead or rejected rows to archive; at most MaxSelection.
	IDs []string `json:"ids,omitempty"`
	// Class and Message name a failure group (GET /api/v1/outbox/groups): its newest
	// MaxSelection rows are archived.
	Class   string `json:"class,omitempty"`
	Message string `json:"message,omitempty"`
}

// InboxArchiveRequest is the body of POST /api/v1/inbox/archive: keys, or a failure group.
type InboxArchiveRequest struct {
	// Keys are the failed rows to archive; at most MaxSelection.
	Keys []RetryKey `json:"keys,omitempty"`
	// Class and Message name a failure group (GET /api/v1/inbox/groups): its oldest
	// MaxSelection rows are archived.
	Class   string `json:"class,omitempty"`
	Message string `json:"message,omitempty"`
}

// ArchiveAnswer answers an archive request.
type ArchiveAnswer struct {
	// Archived counts the rows archived now.
	Archived int `json:"archived"`
	// IDs (outbox) or Keys (inbox) are the rows archived now.
	IDs  []string   `json:"ids,omitempty"`
	Keys []RetryKey `json:"keys,omitempty"`
	// NotArchived counts the rows named that were not archived: missing, in another state, or
	// archived already.
	NotArchived int `json:"not_archived"`
	// Remaining reports, for a group, that it has more rows: call again.
	Remaining bool `json:"remaining,omitempty"`
}

// archiveWhat says what an archive request names, or why it is refused.
func archiveSelection(n int, class, message string) error {
	switch {
	case n == 0 && class == "":
		return errors.New("name the rows, or a failure group (class and message as the groups list them)")
	case n > 0 && (class != "" || message != ""):
		return errors.New("give either rows or a group, not both")
	case n > MaxSelection:
		return fmt.Errorf("at most %d rows per request, got %d", MaxSelection, n)
	}
	return nil
}

// outboxArchiveIDs resolves an outbox archive request into outbox ids.
func (c *Console) outboxArchiveIDs(r *http.Request, q OutboxArchiveRequest) (ids []envelope.UUID, more bool, err error) {
	if err := archiveSelection(len(q.IDs), q.Class, q.Message); err != nil {
		return nil, false, badRequest{err}
	}
	names := q.IDs
	if q.Class != "" {
		if names, more, err = c.outboxGroupIDs(r.Context(), GroupRef{Class: q.Class, Message: q.Message}); err != nil {
			return nil, false, err
		}
	}
	for _, s := range names {
		id, err := envelope.ParseUUID(s)
		if err != nil {
			return nil, false, badRequest{fmt.Errorf("id %q is not a UUID", s)}
		}
		ids = append(ids, id)
	}
	return ids, more, nil
}

// archiveOutbox archives the rows and logs who did.
func (c *Console) archiveOutbox(r *http.Request, ids []envelope.UUID) (ArchiveAnswer, error) {
	var done []envelope.UUID
	err := pgx.BeginFunc(r.Context(), c.cfg.Outbox.Pool, func(tx pgx.Tx) error {
		var err error
		done, err = c.outbox.ArchiveTx(r.Context(), tx, ids)
		return err
	})
	if err != nil {
		return ArchiveAnswer{}, err
	}
	ans := ArchiveAnswer{Archived: len(done), NotArchived: len(ids) - len(done), IDs: []string{}}
	for _, id := range done {
		ans.IDs = append(ans.IDs, id.String())
	}
	c.action(r, "outbox archive", "named", len(ids), "archived", ans.IDs)
	return ans, nil
}

// inboxArchiveKeys resolves an inbox archive request into keys.
func (c *Console) inboxArchiveKeys(r *http.Request, q InboxArchiveRequest) (keys []RetryKey, more bool, err error) {
	if err := archiveSelection(len(q.Keys), q.Class, q.Message); err != nil {
		return nil, false, badRequest{err}
	}
	if q.Class != "" {
		return c.inboxGroupKeys(r.Context(), GroupRef{Class: q.Class, Message: q.Message})
	}
	for i, k := range q.Keys {
		if k.Source == "" || k.DedupeKey == "" {
			return nil, false, badRequest{fmt.Errorf("keys[%d]: source and dedupe_key are both required", i)}
		}
	}
	return q.Keys, false, nil
}

// archiveInbox archives the rows and logs who did.
func (c *Console) archiveInbox(r *http.Request, keys []RetryKey) (ArchiveAnswer, error) {
	ks := make([]inbox.Key, len(keys))
	for i, k := range keys {
		ks[i] = inbox.Key{Source: k.Source, DedupeKey: k.DedupeKey}
	}
	done, err := c.inbox.Archive(r.Context(), c.cfg.Inbox.Pool, ks)
	if err != nil {
		return ArchiveAnswer{}, err
	}
	ans := ArchiveAnswer{Archived: len(done), NotArchived: len(keys) - len(done), Keys: []RetryKey{}}
	for _, k := range done {
		ans.Keys = append(ans.Keys, RetryKey{Source: k.Source, DedupeKey: k.DedupeKey})
	}
	c.action(r, "inbox archive", "consumer", c.cfg.Inbox.Consumer, "named", len(keys), "archived", len(done))
	return ans, nil
}

// answerArchiveError answers a resolution or archive error.
func (c *Console) answerArchiveError(w http.ResponseWriter, r *http.Request, err error) {
	var bad badRequest
	if errors.As(err, &bad) {
		c.fail(w, r, strings.HasPrefix(r.URL.Path, "/api/"), http.StatusBadRequest, "archive: "+bad.Error())
		return
	}
	c.serverError(w, r, err)
}

func (c *Console) apiOutboxArchive(w http.ResponseWriter, r *http.Request) {
	var q OutboxArchiveRequest
	if status, msg := decodeBody(r, &q); status != 0 {
		writeError(w, status, msg)
		return
	}
	ids, more, err := c.outboxArchiveIDs(r, q)
	if err != nil {
		c.answerArchiveError(w, r, err)
		return
	}
	if len(ids) == 0 {
		writeError(w, http.StatusNotFound, "no dead or rejected row is in this group (any more): list the groups again")
		return
	}
	ans, err := c.archiveOutbox(r, ids)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	ans.Remaining = more
	writeJSON(w, http.StatusOK, ans)
}

func (c *Console) apiInboxArchive(w http.ResponseWriter, r *http.Request) {
	var q InboxArchiveRequest
	if status, msg := decodeBody(r, &q); status != 0 {
		writeError(w, status, msg)
		return
	}
	keys, more, err := c.inboxArchiveKeys(r, q)
	if err != nil {
		c.answerArchiveError(w, r, err)
		return
	}
	if len(keys) == 0 {
		writeError(w, http.StatusNotFound, "no failed message is in this group (any more): list the groups again")
		return
	}
	ans, err := c.archiveInbox(r, keys)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	ans.Remaining = more
	writeJSON(w, http.StatusOK, ans)
}

// archiveData is the archive confirmation page's content.
type archiveData struct {
	// Kind is "outbox" or "inbox".
	Kind string
	// Outbox and Inbox are the rows named, as stored now.
	Outbox []OutboxRow
	Inbox  []InboxEntry
	// Count is how many rows are named.
	Count int
}

// pageOutboxArchive confirms, then archives, the outbox rows named by id (the list's
// selection) or by group (the groups page), and answers 303 to the result.
func (c *Console) pageOutboxArchive(w http.ResponseWriter, r *http.Request) {
	q := OutboxArchiveRequest{IDs: r.PostForm["id"], Class: r.PostFormValue("class"), Message: r.PostFormValue("message")}
	ids, _, err := c.outboxArchiveIDs(r, q)
	if err != nil {
		c.answerArchiveError(w, r, err)
		return
	}
	if len(ids) == 0 {
		c.pageError(w, r, http.StatusNotFound, "No dead or rejected row is in this group any more: open the groups again.")
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		d := archiveData{Kind: "outbox", Count: len(ids)}
		for _, id := range ids {
			row, err := c.outbox.Lookup(r.Context(), c.cfg.Outbox.Pool, id)
			switch {
			case errors.Is(err, outbox.ErrNotFound):
			case err != nil:
				c.serverError(w, r, err)
				return
			default:
				d.Outbox = append(d.Outbox, outboxRowOf(row, 0))
			}
		}
		c.render(w, r, http.StatusOK, "archive", "Confirm archive", "outbox", d)
		return
	}
	ans, err := c.archiveOutbox(r, ids)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	v := url.Values{"kind": {"outbox"}, "n": {strconv.Itoa(ans.Archived)}, "not": {strconv.Itoa(ans.NotArchived)}}
	http.Redirect(w, r, "/console/archived?"+c.guard.sign(v), http.StatusSeeOther)
}

// pageInboxArchive is pageOutboxArchive for the inbox's failed messages.
func (c *Console) pageInboxArchive(w http.ResponseWriter, r *http.Request) {
	q := InboxArchiveRequest{Class: r.PostFormValue("class"), Message: r.PostFormValue("message")}
	for _, v := range r.PostForm["key"] {
		k, err := parseFormKey(v)
		if err != nil {
			c.pageError(w, r, http.StatusBadRequest, "Archive: "+err.Error()+".")
			return
		}
		q.Keys = append(q.Keys, k)
	}
	keys, _, err := c.inboxArchiveKeys(r, q)
	if err != nil {
		c.answerArchiveError(w, r, err)
		return
	}
	if len(keys) == 0 {
		c.pageError(w, r, http.StatusNotFound, "No failed message is in this group any more: open the groups again.")
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		d := archiveData{Kind: "inbox", Count: len(keys)}
		for _, k := range keys {
			e, err := c.inbox.Lookup(r.Context(), c.cfg.Inbox.Pool, inbox.Key{Source: k.Source, DedupeKey: k.DedupeKey})
			switch {
			case errors.Is(err, inbox.ErrNotFound):
			case err != nil:
				c.serverError(w, r, err)
				return
			default:
				d.Inbox = append(d.Inbox, c.inboxEntry(e, 0))
			}
		}
		c.render(w, r, http.StatusOK, "archive", "Confirm archive", "inbox", d)
		return
	}
	ans, err := c.archiveInbox(r, keys)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	v := url.Values{"kind": {"inbox"}, "n": {strconv.Itoa(ans.Archived)}, "not": {strconv.Itoa(ans.NotArchived)}}
	http.Redirect(w, r, "/console/archived?"+c.guard.sign(v), http.StatusSeeOther)
}

// archivedData is the archive result page's content.
type archivedData struct {
	Kind          string
	Archived, Not int
}

func (c *Console) pageArchived(w http.ResponseWriter, r *http.Request) {
	v, ok := c.guard.verify(r.URL.Query())
	kind := v.Get("kind")
	if !ok || (kind != "outbox" && kind != "inbox") {
		c.pageError(w, r, http.StatusBadRequest, "This result link was not made by this console: it was changed, or it outlived a restart of a console without a token. Open the archived rows to see them.")
		return
	}
	d := archivedData{Kind: kind}
	d.Archived, _ = strconv.Atoi(v.Get("n"))
	d.Not, _ = strconv.Atoi(v.Get("not"))
	c.render(w, r, http.StatusOK, "archived", "Archived", kind, d)
}
