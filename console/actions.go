package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
)

// The console's actions are three steps: a POST of the selection answers a confirmation page
// that shows the rows affected (event type, key, attempts, last error); the confirmed POST acts
// and answers 303 See Other to a GET page describing the outcome, so that a reload or the back
// button never repeats an action. The outcome travels in the result page's query, signed with
// the console's CSRF key so that a link cannot make the console claim an action it did not do.

// MaxResultRows is how many rows a result page names one by one; the counts cover the rest.
const MaxResultRows = 50

// confirmSample is how many rows a filter requeue's confirmation lists.
const confirmSample = 20

// requeueData is the requeue confirmation page's content.
type requeueData struct {
	Request RequeueRequest
	// Count is how many rows the confirmed request would move (filter), or len(IDs).
	Count int64
	// Rows are the rows named (ids), or the newest of the filter's (Sample).
	Rows []OutboxRow
	// Missing lists named ids with no row.
	Missing []string
	// Sample reports that Rows are the confirmSample newest of Count.
	Sample bool
	// Rejected counts the rows of Rows that Kafka rejected for good; Codes their codes.
	Rejected int
	Codes    []string
	// RejectedElsewhere reports rejected rows of the filter beyond Rows.
	RejectedElsewhere bool
	// NeedAck reports that the confirmation was posted without acknowledging the rejected rows.
	NeedAck bool
	Warning string
}

// ackRejected is the confirmation's field acknowledging that rejected rows are sent again.
const ackRejected = "rejected_ok"

func (c *Console) pageOutboxRequeue(w http.ResponseWriter, r *http.Request) {
	q := RequeueRequest{
		IDs: r.PostForm["id"], Source: strings.TrimSpace(r.PostFormValue("source")),
		Destination: strings.TrimSpace(r.PostFormValue("destination")), All: r.PostFormValue("all") == "yes",
	}
	f, err := q.filter()
	if err != nil {
		c.pageError(w, r, http.StatusBadRequest, "Requeue: "+err.Error()+". Select rows in the outbox list first.")
		return
	}
	d, err := c.requeueContext(r.Context(), q, f)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	confirmed := r.PostFormValue("confirm") == "yes"
	if confirmed && (d.Rejected > 0 || d.RejectedElsewhere) && r.PostFormValue(ackRejected) != "yes" {
		d.NeedAck, confirmed = true, false
	}
	if !confirmed {
		c.render(w, r, http.StatusOK, "requeue", "Confirm requeue", "outbox", d)
		return
	}
	ans, err := c.requeue(r, q)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	v := url.Values{"n": {strconv.Itoa(ans.Count)}}
	for i, id := range ans.Requeued {
		if i == MaxResultRows {
			break
		}
		v.Add("id", id)
	}
	for i, s := range ans.Skipped {
		if i == MaxResultRows {
			break
		}
		v.Add("skip", s.ID+" "+s.Reason)
	}
	http.Redirect(w, r, "/console/outbox/requeued?"+c.guard.sign(v), http.StatusSeeOther)
}

// requeueContext reads the rows a requeue would move, for its confirmation.
func (c *Console) requeueContext(ctx context.Context, q RequeueRequest, f outbox.RequeueFilter) (requeueData, error) {
	d := requeueData{Request: q, Warning: outbox.RequeueWarning, Count: int64(len(q.IDs))}
	pool := c.cfg.Outbox.Pool
	if len(f.IDs) > 0 {
		for _, id := range f.IDs {
			row, err := c.outbox.Lookup(ctx, pool, id)
			switch {
			case errors.Is(err, outbox.ErrNotFound):
				d.Missing = append(d.Missing, id.String())
			case err != nil:
				return d, err
			default:
				d.Rows = append(d.Rows, outboxRowOf(row, 0))
			}
		}
	} else {
		n, err := c.countRequeueable(ctx, q.Source, q.Destination)
		if err != nil {
			return d, err
		}
		d.Count = n
		opts := outbox.ListOptions{Statuses: []outbox.Status{outbox.StatusDead, outbox.StatusRejected}, Source: q.Source, Destination: q.Destination,
			NewestFirst: true, Limit: confirmSample, PayloadBytes: outbox.NoPayload}
		rows, err := c.outbox.ListOutbox(ctx, pool, opts)
		if err != nil {
			return d, err
		}
		for _, row := range rows {
			d.Rows = append(d.Rows, outboxRowOf(row, 0))
		}
		d.Sample = int64(len(d.Rows)) < n
		opts.Statuses, opts.Limit = []outbox.Status{outbox.StatusRejected}, 1
		if rejected, err := c.outbox.ListOutbox(ctx, pool, opts); err != nil {
			return d, err
		} else if len(rejected) > 0 {
			d.RejectedElsewhere = true
			if code := rejected[0].RejectionCode; code != "" {
				d.Codes = append(d.Codes, code)
			}
		}
	}
	for _, o := range d.Rows {
		if o.Status == "rejected" {
			d.Rejected++
			if o.RejectionCode != "" && !slices.Contains(d.Codes, o.RejectionCode) {
				d.Codes = append(d.Codes, o.RejectionCode)
			}
		}
	}
	if d.Rejected > 0 {
		d.RejectedElsewhere = false
	}
	return d, nil
}

// requeuedData is the requeue result page's content.
type requeuedData struct {
	Count   int
	Rows    []OutboxRow
	Gone    []string
	Skipped []SkippedRow
	More    bool
	Warning string
}

func (c *Console) pageOutboxRequeued(w http.ResponseWriter, r *http.Request) {
	v, ok := c.guard.verify(r.URL.Query())
	if !ok {
		c.pageError(w, r, http.StatusBadRequest, "This result link was not made by this console: it was changed, or it outlived a restart of a console without a token. Open the outbox list to see the rows as they are.")
		return
	}
	n, _ := strconv.Atoi(v.Get("n"))
	d := requeuedData{Count: n, Warning: outbox.RequeueWarning, More: n > len(v["id"])}
	for _, s := range v["id"] {
		id, err := envelope.ParseUUID(s)
		if err != nil {
			continue
		}
		row, err := c.outbox.Lookup(r.Context(), c.cfg.Outbox.Pool, id)
		switch {
		case errors.Is(err, outbox.ErrNotFound):
			d.Gone = append(d.Gone, s)
		case err != nil:
			c.serverError(w, r, err)
			return
		default:
			d.Rows = append(d.Rows, outboxRowOf(row, 0))
		}
	}
	for _, s := range v["skip"] {
		id, reason, _ := strings.Cut(s, " ")
		d.Skipped = append(d.Skipped, SkippedRow{ID: id, Reason: reason})
	}
	c.render(w, r, http.StatusOK, "requeued", "Requeued", "outbox", d)
}

// retryData is the retry confirmation page's content.
type retryData struct {
	Consumer string
	Keys     []RetryKey
	// Rows are the named rows as stored now; Missing the keys with no row.
	Rows    []InboxEntry
	Missing []RetryKey
}

func (c *Console) pageInboxRetry(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Inbox.Handler == nil {
		c.pageError(w, r, http.StatusNotImplemented, "Retry is not available: this console has no handler to run.")
		return
	}
	var q RetryRequest
	for _, v := range r.PostForm["key"] {
		k, err := parseFormKey(v)
		if err != nil {
			c.pageError(w, r, http.StatusBadRequest, "Retry: "+err.Error()+".")
			return
		}
		q.Keys = append(q.Keys, k)
	}
	if err := q.validate(); err != nil {
		c.pageError(w, r, http.StatusBadRequest, "Retry: "+err.Error()+". Select messages in the inbox list first.")
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		d := retryData{Consumer: c.cfg.Inbox.Consumer, Keys: q.Keys}
		for _, k := range q.Keys {
			e, err := c.inbox.Lookup(r.Context(), c.cfg.Inbox.Pool, inbox.Key{Source: k.Source, DedupeKey: k.DedupeKey})
			switch {
			case errors.Is(err, inbox.ErrNotFound):
				d.Missing = append(d.Missing, k)
			case err != nil:
				c.serverError(w, r, err)
				return
			default:
				d.Rows = append(d.Rows, c.inboxEntry(e, 0))
			}
		}
		c.render(w, r, http.StatusOK, "retry", "Confirm retry", "inbox", d)
		return
	}
	ans, err := c.retry(r, q)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	v := url.Values{"ok": {strconv.Itoa(ans.Succeeded)}, "failed": {strconv.Itoa(ans.Failed)}}
	for i, res := range ans.Results {
		if i == MaxResultRows {
			break
		}
		v.Add("r", res.Outcome+" "+RetryKey{Source: res.Source, DedupeKey: res.DedupeKey}.Value())
	}
	http.Redirect(w, r, "/console/inbox/retried?"+c.guard.sign(v), http.StatusSeeOther)
}

// retriedData is the retry result page's content.
type retriedData struct {
	Succeeded, Failed int
	Results           []retriedRow
	More              bool
}

// retriedRow is one re-run message: its outcome, and the row as it is now.
type retriedRow struct {
	Outcome string
	Key     RetryKey
	Entry   *InboxEntry
}

// OK reports an outcome that left the message completed.
func (r retriedRow) OK() bool { return r.Outcome == "processed" || r.Outcome == "duplicate" }

func (c *Console) pageInboxRetried(w http.ResponseWriter, r *http.Request) {
	v, ok := c.guard.verify(r.URL.Query())
	if !ok {
		c.pageError(w, r, http.StatusBadRequest, "This result link was not made by this console: it was changed, or it outlived a restart of a console without a token. Open the inbox list to see the messages as they are.")
		return
	}
	d := retriedData{}
	d.Succeeded, _ = strconv.Atoi(v.Get("ok"))
	d.Failed, _ = strconv.Atoi(v.Get("failed"))
	d.More = d.Succeeded+d.Failed > len(v["r"])
	for _, s := range v["r"] {
		outcome, key, _ := strings.Cut(s, " ")
		k, err := parseFormKey(key)
		if err != nil {
			continue
		}
		row := retriedRow{Outcome: outcome, Key: k}
		e, err := c.inbox.Lookup(r.Context(), c.cfg.Inbox.Pool, inbox.Key{Source: k.Source, DedupeKey: k.DedupeKey})
		switch {
		case errors.Is(err, inbox.ErrNotFound):
		case err != nil:
			c.serverError(w, r, err)
			return
		default:
			ie := c.inboxEntry(e, 0)
			row.Entry = &ie
		}
		d.Results = append(d.Results, row)
	}
	c.render(w, r, http.StatusOK, "retried", "Retried", "inbox", d)
}

// sign encodes v with a signature of its encoding ("sig"), for a result page's query.
func (g *guard) sign(v url.Values) string {
	v.Del("sig")
	enc := v.Encode()
	return enc + "&sig=" + g.mac(enc)
}

// verify checks the signature of a result page's query and returns the query without it.
func (g *guard) verify(v url.Values) (url.Values, bool) {
	sig := v.Get("sig")
	out := url.Values{}
	for k, vs := range v {
		if k != "sig" {
			out[k] = vs
		}
	}
	return out, sig != "" && hmac.Equal([]byte(sig), []byte(g.mac(out.Encode())))
}

func (g *guard) mac(s string) string {
	m := hmac.New(sha256.New, g.csrfKey)
	m.Write([]byte("keiro-console-result\x00"))
	m.Write([]byte(s))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
