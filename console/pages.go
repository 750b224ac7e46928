package console

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
)

// page is what every template receives: the layout's fields and the page's own Data.
type page struct {
	Title    string
	Heading  string
	Active   string
	Who      string
	CSRF     string
	ReadOnly bool
	Outbox   bool
	Inbox    bool
	Events   bool
	CanRetry bool
	// DeadLetters reports that the consumer's dead-letter topics are served.
	DeadLetters bool
	// Refresh is the seconds between refreshes of the page's live part (0: none).
	Refresh int
	// OutboxMax and InboxMax are the attempt ceilings (0: unknown).
	OutboxMax int
	InboxMax  int
	Data      any
}

var funcs = template.FuncMap{
	"age":      fmtAge,
	"ageOf":    func(t time.Time) string { return fmtAge(ptr(time.Since(t).Seconds())) },
	"ts":       fmtTime,
	"tsp":      func(t *time.Time) string { return fmtTimePtr(t) },
	"pathesc":  pathEscape,
	"chart":    chart,
	"short":    short,
	"deref":    func(s *string) string { return derefOr(s, "") },
	"deref64":  func(n *int64) int64 { return *n },
	"bytes":    fmtBytes,
	"join":     strings.Join,
	"ageOf0":   func(s float64) string { return fmtAge(&s) },
	"keyOf":    func(s *string) string { return derefOr(s, "—") },
	"statuses": func() []string { return outboxStatuses },
	"has": func(list []string, s string) bool {
		for _, v := range list {
			if v == s {
				return true
			}
		}
		return false
	},
	"query": func(kv ...string) template.URL {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				v.Add(kv[i], kv[i+1])
			}
		}
		return template.URL(v.Encode())
	},
	"joined":   func(list []string) string { return strings.Join(list, ",") },
	"attempts": attempts,
	"when":     when,
	"either":   either,
	"whenp":    whenp,
	// reasonOr is a dead-letter reason, or "unknown" for a record without one.
	"reasonOr": func(s string) string {
		if s == "" {
			return "unknown"
		}
		return s
	},
	"subStatuses": func() []string {
		return []string{events.DeadLetterDead, events.DeadLetterReplay, events.DeadLetterReplayed}
	},
	"subValue":  subDeadLetterValue,
	"groupLink": groupQuery,
}

func ptr[T any](v T) *T { return &v }

func derefOr(s *string, d string) string {
	if s == nil {
		return d
	}
	return *s
}

func pathEscape(s string) string { return url.PathEscape(s) }

// fmtBytes prints a size in binary units: "512 B", "16.0 KiB", "1.5 GiB".
func fmtBytes(n int64) string {
	if n < 1024 && n > -1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, unit := float64(n), "B"
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		if f > -1024 && f < 1024 {
			break
		}
		f, unit = f/1024, u
	}
	return fmt.Sprintf("%.1f %s", f, unit)
}

// fmtAge prints seconds as "4s", "3m 12s", "2h 5m", "3d 4h"; "—" for none.
func fmtAge(s *float64) string {
	if s == nil {
		return "—"
	}
	d := time.Duration(*s * float64(time.Second)).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func fmtTimePtr(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return fmtTime(*t)
}

// either joins words for a sentence: "dead", "dead or rejected", "dead, rejected or failed".
func either(words []string) string {
	switch n := len(words); n {
	case 0:
		return ""
	case 1:
		return words[0]
	default:
		return strings.Join(words[:n-1], ", ") + " or " + words[n-1]
	}
}

// refreshSeconds is, per page, how often its live part is fetched again in place.
var refreshSeconds = map[string]int{"overview": 10, "outbox": 5, "inbox": 5, "subscriptions": 10}

// attempts prints an attempt count against its ceiling: "3 of 10", or "3 attempts" when the
// ceiling is not known (0).
func attempts(n, ceiling int) string {
	switch {
	case ceiling > 0:
		return fmt.Sprintf("%d of %d", n, ceiling)
	case n == 1:
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// when shows t in UTC beside how long ago it was ("4 min ago", or "in 30 s" for a time to come),
// as a <time> element; "—" for the zero time. Every value written is a formatted time.
func when(t time.Time) template.HTML {
	if t.IsZero() {
		return "—"
	}
	return template.HTML(`<time datetime="` + t.UTC().Format(time.RFC3339) + `">` + fmtTime(t) +
		`</time> <span class="rel">` + relative(time.Since(t)) + `</span>`)
}

// whenp is when of an optional time.
func whenp(t *time.Time) template.HTML {
	if t == nil {
		return "—"
	}
	return when(*t)
}

// relative prints an elapsed duration as "12 s ago", "4 min ago", "3 h ago", "2 d ago"; a
// negative one as "in 4 min".
func relative(d time.Duration) string {
	future := d < 0
	if future {
		d = -d
	}
	var n string
	switch {
	case d < time.Minute:
		n = fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		n = fmt.Sprintf("%d min", int(d.Minutes()))
	case d < 48*time.Hour:
		n = fmt.Sprintf("%d h", int(d.Hours()))
	default:
		n = fmt.Sprintf("%d d", int(d.Hours()/24))
	}
	if future {
		return "in " + n
	}
	return n + " ago"
}

// short flattens s to one line of at most n runes.
func short(n int, s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// pageNames are the templates of templates/, each parsed with layout.html.
var pageNames = []string{"overview", "outbox", "outbox_row", "requeue", "inbox", "inbox_entry", "retry", "subscriptions", "search", "requeued", "retried", "error",
	"deadletters", "deadletter", "replay", "replayed", "subdeadletters", "subreplay", "subreplayed", "groups", "archive", "archived", "sagas"}

func parsePages() (map[string]*template.Template, error) {
	layout, err := fs.ReadFile(templateFS, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("read console layout: %w", err)
	}
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		body, err := fs.ReadFile(templateFS, "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("read console page %s: %w", name, err)
		}
		t, err := template.New("layout").Funcs(funcs).Parse(string(layout))
		if err == nil {
			_, err = t.Parse(string(body))
		}
		if err != nil {
			return nil, fmt.Errorf("parse console page %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// render writes page name with data, or the error page if rendering fails.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, heading, active string, data any) {
	p := principalOf(r.Context())
	pg := page{
		Title: c.cfg.Title, Heading: heading, Active: active, Who: p.name, CSRF: c.guard.csrfToken(p),
		ReadOnly: c.cfg.ReadOnly, Outbox: c.cfg.Outbox != nil, Inbox: c.cfg.Inbox != nil, Events: c.cfg.Events != nil,
		CanRetry: c.cfg.Inbox != nil && c.cfg.Inbox.Handler != nil && !c.cfg.ReadOnly, Data: data,
		DeadLetters: c.cfg.Inbox != nil && len(c.cfg.Inbox.DeadLetterTopics) > 0,
	}
	pg.Refresh = refreshSeconds[name]
	if c.cfg.Outbox != nil {
		pg.OutboxMax = c.cfg.Outbox.MaxAttempts
	}
	if c.cfg.Inbox != nil {
		pg.InboxMax = c.cfg.Inbox.MaxAttempts
	}
	var buf bytes.Buffer
	tmpl := "layout"
	if r.URL.Query().Get("fragment") == "live" && status == http.StatusOK && c.pages[name].Lookup("live") != nil {
		tmpl = "live" // the part a page's script fetches again in place
	}
	if err := c.pages[name].ExecuteTemplate(&buf, tmpl, pg); err != nil {
		c.log.Error("console: render page", "page", name, "err", err)
		http.Error(w, "render the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// overviewData is the overview page's content.
type overviewData struct {
	Outbox    *OutboxSummary
	OutboxErr string
	Inbox     *InboxSummary
	InboxErr  string
	Lag       *ConsumerLag
	LagErr    string
	Subs      *Subscriptions
	SubsErr   string
}

func (c *Console) pageOverview(w http.ResponseWriter, r *http.Request) {
	var d overviewData
	ctx := r.Context()
	if c.cfg.Outbox != nil {
		if s, err := c.readOutboxSummary(ctx); err != nil {
			d.OutboxErr = err.Error()
		} else {
			d.Outbox = &s
		}
	}
	if c.cfg.Inbox != nil {
		if s, err := c.readInboxSummary(ctx); err != nil {
			d.InboxErr = err.Error()
		} else {
			d.Inbox = &s
		}
		if l, err := c.readLag(ctx); err != nil {
			d.LagErr = err.Error()
		} else {
			d.Lag = &l
		}
	}
	if c.cfg.Events != nil {
		if s, err := c.readSubscriptions(ctx); err != nil {
			d.SubsErr = err.Error()
		} else {
			d.Subs = &s
		}
	}
	c.render(w, r, http.StatusOK, "overview", "Overview", "overview", d)
}

// outboxListData is the outbox list page's content.
type outboxListData struct {
	Filter outboxFilter
	Page   OutboxPage
	First  bool
}

func (c *Console) pageOutboxRows(w http.ResponseWriter, r *http.Request) {
	f, err := parseOutboxFilter(r)
	if err != nil {
		c.pageError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	pg, err := c.listOutboxRows(r.Context(), f)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "outbox", "Outbox: dead, rejected and retrying rows", "outbox",
		outboxListData{Filter: f, Page: pg, First: f.Before == 0})
}

func (c *Console) pageOutboxRow(w http.ResponseWriter, r *http.Request) {
	o, err := c.getOutboxRow(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, errBadID):
		c.pageError(w, r, http.StatusBadRequest, err.Error()+": open a row from the outbox list.")
	case errors.Is(err, outbox.ErrNotFound):
		c.pageError(w, r, http.StatusNotFound, err.Error()+" (it may have been deleted by retention).")
	case err != nil:
		c.serverError(w, r, err)
	default:
		c.render(w, r, http.StatusOK, "outbox_row", "Outbox row "+o.OutboxID, "outbox", o)
	}
}

// inboxListData is the inbox list page's content.
type inboxListData struct {
	Consumer string
	Source   string
	Page     InboxPage
	First    bool
	// Archived lists the archived messages instead of the working list.
	Archived bool
}

// ArchivedParam is the list's ?archived= value: "true", or "" for the working list.
func (d inboxListData) ArchivedParam() string { return archivedParam(d.Archived) }

func (c *Console) pageInboxFailed(w http.ResponseWriter, r *http.Request) {
	pg, err := c.listInboxFailed(r.Context(), r)
	var bad badRequest
	switch {
	case errors.As(err, &bad):
		c.pageError(w, r, http.StatusBadRequest, bad.Error())
		return
	case err != nil:
		c.serverError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "inbox", "Inbox: failed and poisoned messages", "inbox", inboxListData{
		Consumer: c.cfg.Inbox.Consumer, Source: r.URL.Query().Get("source"), Page: pg, First: r.URL.Query().Get("cursor") == "",
		Archived: r.URL.Query().Get("archived") == "true",
	})
}

func (c *Console) pageInboxEntry(w http.ResponseWriter, r *http.Request) {
	k, err := inboxKey(r)
	if err != nil {
		c.pageError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	e, err := c.inboxDetail(r.Context(), k)
	switch {
	case errors.Is(err, inbox.ErrNotFound):
		c.pageError(w, r, http.StatusNotFound, err.Error()+" for consumer "+c.cfg.Inbox.Consumer+".")
	case err != nil:
		c.serverError(w, r, err)
	default:
		c.render(w, r, http.StatusOK, "inbox_entry", "Inbox message "+k.Source+" / "+k.DedupeKey, "inbox", e)
	}
}

// Value is a key as the retry form posts it: the escaped source, "/", the escaped dedupe key.
func (k RetryKey) Value() string { return pathEscape(k.Source) + "/" + pathEscape(k.DedupeKey) }

// parseFormKey reads a key posted by the retry form (RetryKey.Value, InboxEntry.Path).
func parseFormKey(v string) (RetryKey, error) {
	src, key, ok := strings.Cut(v, "/")
	s, err1 := url.PathUnescape(src)
	k, err2 := url.PathUnescape(key)
	if !ok || err1 != nil || err2 != nil {
		return RetryKey{}, fmt.Errorf("%q is not an escaped source/dedupe-key", v)
	}
	return RetryKey{Source: s, DedupeKey: k}, nil
}

func (c *Console) pageSubscriptions(w http.ResponseWriter, r *http.Request) {
	s, err := c.readSubscriptions(r.Context())
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "subscriptions", "Subscriptions", "subscriptions", s)
}
