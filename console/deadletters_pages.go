package console

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/keiro-go/keiro/events"
)

// deadLettersData is the dead-letter list page's content.
type deadLettersData struct {
	Consumer string
	Topic    string
	Page     DeadLetterPage
	First    bool
}

func (c *Console) pageDeadLetters(w http.ResponseWriter, r *http.Request) {
	pg, err := c.listDeadLetters(r.Context(), r)
	var bad badRequest
	switch {
	case errors.As(err, &bad):
		c.pageError(w, r, http.StatusBadRequest, bad.Error())
		return
	case err != nil:
		c.serverError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "deadletters", "Dead-letter topics", "deadletters", deadLettersData{
		Consumer: c.cfg.Inbox.Consumer, Topic: r.URL.Query().Get("topic"), Page: pg, First: r.URL.Query().Get("cursor") == "",
	})
}

func (c *Console) pageDeadLetter(w http.ResponseWriter, r *http.Request) {
	ref, err := pathRecordRef(r)
	if err != nil {
		c.pageError(w, r, http.StatusBadRequest, err.Error()+": open a record from the dead-letter list.")
		return
	}
	rec, err := c.readDeadLetter(r.Context(), ref)
	var nf errDeadLetterNotFound
	var bad badRequest
	switch {
	case errors.As(err, &bad):
		c.pageError(w, r, http.StatusBadRequest, bad.Error())
	case errors.As(err, &nf):
		c.pageError(w, r, http.StatusNotFound, nf.Error()+".")
	case err != nil:
		c.serverError(w, r, err)
	default:
		c.render(w, r, http.StatusOK, "deadletter", "Dead letter "+ref.Topic+" / "+strconv.Itoa(int(ref.Partition))+" @ "+strconv.FormatInt(ref.Offset, 10),
			"deadletters", c.deadLetterOf(rec, DefaultDetailPayloadBytes))
	}
}

// replayData is the replay confirmation page's content.
type replayData struct {
	Refs []RecordRef
	// Records are the named records; Missing the references with no record.
	Records []DeadLetterRecord
	Missing []SkippedRecord
	// Replayable counts the records a confirmed replay writes.
	Replayable int
	// Targets are the topics a confirmed replay writes to, in the order of the records.
	Targets []string
}

func (c *Console) pageDeadLetterReplay(w http.ResponseWriter, r *http.Request) {
	var q ReplayRequest
	for _, v := range r.PostForm["record"] {
		ref, err := parseRecordRef(v)
		if err != nil {
			c.pageError(w, r, http.StatusBadRequest, "Replay: "+err.Error()+".")
			return
		}
		q.Records = append(q.Records, ref)
	}
	if err := q.validate(); err != nil {
		c.pageError(w, r, http.StatusBadRequest, "Replay: "+err.Error()+". Select records in the dead-letter list first.")
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		d := replayData{Refs: q.Records}
		for _, ref := range q.Records {
			rec, err := c.readDeadLetter(r.Context(), ref)
			var nf errDeadLetterNotFound
			var bad badRequest
			switch {
			case errors.As(err, &nf), errors.As(err, &bad):
				d.Missing = append(d.Missing, SkippedRecord{Record: ref, Reason: err.Error()})
			case err != nil:
				c.serverError(w, r, err)
				return
			default:
				dl := c.deadLetterOf(rec, 0)
				if dl.Replayable {
					d.Replayable++
					if !slices.Contains(d.Targets, dl.Original.Topic) {
						d.Targets = append(d.Targets, dl.Original.Topic)
					}
				}
				d.Records = append(d.Records, dl)
			}
		}
		c.render(w, r, http.StatusOK, "replay", "Confirm replay", "deadletters", d)
		return
	}
	ans, err := c.replayDeadLetters(r, q)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	v := url.Values{"n": {strconv.Itoa(len(ans.Replayed))}, "skipped": {strconv.Itoa(len(ans.Skipped))}}
	for i, rr := range ans.Replayed {
		if i == MaxResultRows {
			break
		}
		to := RecordRef{Topic: rr.To.Topic, Partition: rr.To.Partition, Offset: rr.To.Offset}
		v.Add("r", rr.From.Value()+" "+to.Value())
	}
	for i, s := range ans.Skipped {
		if i == MaxResultRows {
			break
		}
		v.Add("skip", s.Record.Value()+" "+s.Reason)
	}
	http.Redirect(w, r, "/console/dead-letters/replayed?"+c.guard.sign(v), http.StatusSeeOther)
}

// replayedData is the replay result page's content.
type replayedData struct {
	Count, SkippedCount int
	Replayed            []ReplayedRecord
	Skipped             []SkippedRecord
	More                bool
}

func (c *Console) pageDeadLetterReplayed(w http.ResponseWriter, r *http.Request) {
	v, ok := c.guard.verify(r.URL.Query())
	if !ok {
		c.pageError(w, r, http.StatusBadRequest, "This result link was not made by this console: it was changed, or it outlived a restart of a console without a token. Open the dead-letter list to see the records.")
		return
	}
	d := replayedData{}
	d.Count, _ = strconv.Atoi(v.Get("n"))
	d.SkippedCount, _ = strconv.Atoi(v.Get("skipped"))
	for _, s := range v["r"] {
		a, b, _ := strings.Cut(s, " ")
		from, err1 := parseRecordRef(a)
		to, err2 := parseRecordRef(b)
		if err1 != nil || err2 != nil {
			continue
		}
		d.Replayed = append(d.Replayed, ReplayedRecord{From: from, To: KafkaPosition{Topic: to.Topic, Partition: to.Partition, Offset: to.Offset}})
	}
	for _, s := range v["skip"] {
		a, reason, _ := strings.Cut(s, " ")
		if ref, err := parseRecordRef(a); err == nil {
			d.Skipped = append(d.Skipped, SkippedRecord{Record: ref, Reason: reason})
		}
	}
	d.More = d.Count > len(d.Replayed) || d.SkippedCount > len(d.Skipped)
	c.render(w, r, http.StatusOK, "replayed", "Replayed", "deadletters", d)
}

// subDeadLettersData is the subscription dead-letter page's content.
type subDeadLettersData struct {
	Filter subDeadLetterFilter
	Page   SubscriptionDeadLetters
}

// subDeadLetterValue is a dead letter as the replay form posts it: the escaped subscription,
// "/", the id.
func subDeadLetterValue(d events.DeadLetter) string {
	return pathEscape(d.Subscription) + "/" + strconv.FormatInt(d.ID, 10)
}

func (c *Console) pageSubDeadLetters(w http.ResponseWriter, r *http.Request) {
	f, err := parseSubDeadLetterFilter(r)
	if err != nil {
		c.pageError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	pg, err := c.listSubDeadLetters(r.Context(), f)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "subdeadletters", "Subscription dead letters", "subscriptions", subDeadLettersData{Filter: f, Page: pg})
}

// subReplayData is the subscription replay confirmation page's content.
type subReplayData struct {
	Subscription string
	All          bool
	// Rows are the named dead letters; Missing the ids with no row of the subscription.
	Rows    []events.DeadLetter
	Missing []int64
	// Dead counts the rows of Rows in status dead (the ones a replay moves).
	Dead int
}

// IDs are the named dead letters' ids.
func (d subReplayData) IDs() []int64 {
	out := make([]int64, 0, len(d.Rows)+len(d.Missing))
	for _, r := range d.Rows {
		out = append(out, r.ID)
	}
	return append(out, d.Missing...)
}

func (c *Console) pageSubDeadLetterReplay(w http.ResponseWriter, r *http.Request) {
	q := SubscriptionReplayRequest{Subscription: strings.TrimSpace(r.PostFormValue("subscription")), All: r.PostFormValue("all") == "yes"}
	for _, v := range r.PostForm["dead_letter"] {
		sub, idText, ok := strings.Cut(v, "/")
		s, err := url.PathUnescape(sub)
		id, err2 := strconv.ParseInt(idText, 10, 64)
		if !ok || err != nil || err2 != nil {
			c.pageError(w, r, http.StatusBadRequest, "Replay: "+strconv.Quote(v)+" is not an escaped subscription/id.")
			return
		}
		if q.Subscription == "" {
			q.Subscription = s
		}
		if s != q.Subscription {
			c.pageError(w, r, http.StatusBadRequest, "Replay: select dead letters of one subscription at a time (filter the list by subscription).")
			return
		}
		q.IDs = append(q.IDs, id)
	}
	if err := q.validate(); err != nil {
		c.pageError(w, r, http.StatusBadRequest, "Replay: "+err.Error()+". Select dead letters in the list first.")
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		d := subReplayData{Subscription: q.Subscription, All: q.All}
		f := events.DeadLetterFilter{Subscription: q.Subscription, Limit: confirmSample}
		if q.All {
			f.Status = events.DeadLetterDead
			rows, err := c.events.ListDeadLetters(r.Context(), c.cfg.Events.Pool, f)
			if err != nil {
				c.serverError(w, r, err)
				return
			}
			d.Rows = rows
		}
		for _, id := range q.IDs {
			f.AfterID, f.Limit = id-1, 1
			rows, err := c.events.ListDeadLetters(r.Context(), c.cfg.Events.Pool, f)
			if err != nil {
				c.serverError(w, r, err)
				return
			}
			if len(rows) == 1 && rows[0].ID == id {
				d.Rows = append(d.Rows, rows[0])
			} else {
				d.Missing = append(d.Missing, id)
			}
		}
		for _, row := range d.Rows {
			if row.Status == events.DeadLetterDead {
				d.Dead++
			}
		}
		c.render(w, r, http.StatusOK, "subreplay", "Confirm replay", "subscriptions", d)
		return
	}
	ans, err := c.replaySubDeadLetters(r, q)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	v := url.Values{"subscription": {ans.Subscription}, "n": {strconv.FormatInt(ans.Requested, 10)}}
	http.Redirect(w, r, "/console/subscriptions/dead-letters/replayed?"+c.guard.sign(v), http.StatusSeeOther)
}

// subReplayedData is the subscription replay result page's content.
type subReplayedData struct {
	Subscription string
	Requested    int64
	Note         string
}

func (c *Console) pageSubDeadLetterReplayed(w http.ResponseWriter, r *http.Request) {
	v, ok := c.guard.verify(r.URL.Query())
	if !ok {
		c.pageError(w, r, http.StatusBadRequest, "This result link was not made by this console: it was changed, or it outlived a restart of a console without a token. Open the dead-letter list to see the rows as they are.")
		return
	}
	n, _ := strconv.ParseInt(v.Get("n"), 10, 64)
	c.render(w, r, http.StatusOK, "subreplayed", "Replay requested", "subscriptions",
		subReplayedData{Subscription: v.Get("subscription"), Requested: n, Note: subReplayNote})
}
