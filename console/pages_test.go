package console_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/console"
)

// TestPagesEmptyState renders every page of a fresh schema.
func TestPagesEmptyState(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	for path, want := range map[string]string{
		"/console/":              "The outbox is empty.",
		"/console/outbox":        "Nothing needs attention here.",
		"/console/inbox":         "No failed messages",
		"/console/subscriptions": "No subscription has a checkpoint yet.",
	} {
		a := r.get(t, path)
		require.Equal(t, http.StatusOK, a.code, path)
		require.Contains(t, a.body, want, path)
		require.Equal(t, "text/html; charset=utf-8", a.header.Get("Content-Type"))
	}
	a := r.get(t, "/console")
	require.Equal(t, http.StatusMovedPermanently, a.code)
	a = r.get(t, "/console/nope")
	require.Equal(t, http.StatusNotFound, a.code)
	require.Contains(t, a.body, "There is no page")
	a = r.get(t, "/api/v1/nope")
	require.Equal(t, http.StatusNotFound, a.code)
	require.Contains(t, a.body, `"error"`)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/console/outbox/42").code)
	require.Equal(t, http.StatusNotFound, r.get(t, "/console/outbox/00000000-0000-0000-0000-000000000000").code)
	require.Equal(t, http.StatusNotFound, r.get(t, "/console/inbox/orders/missing").code)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/console/outbox?status=sent").code)
	for _, asset := range []string{"/console/assets/console.css", "/console/assets/console.js"} {
		a := r.get(t, asset)
		require.Equal(t, http.StatusOK, a.code, asset)
		require.NotEmpty(t, a.body)
	}
}

// TestPagesOfOnePart: a relay's console has no inbox pages and says so.
func TestPagesOfOnePart(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *console.Config) { c.Inbox, c.Events = nil, nil })
	home := r.get(t, "/console/").body
	require.NotContains(t, home, `href="/console/inbox"`)
	a := r.get(t, "/api/v1/inbox/summary")
	require.Equal(t, http.StatusNotFound, a.code)
	require.Contains(t, a.body, "the inbox is not configured")
	require.Equal(t, http.StatusNotFound, r.get(t, "/console/subscriptions").code)
	require.Equal(t, http.StatusNotFound, r.get(t, "/api/v1/consumer/lag").code)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := console.New(console.Config{})
	require.ErrorContains(t, err, "at least one of Outbox, Inbox and Events")
	_, err = console.New(console.Config{
		Outbox: &console.OutboxConfig{Schema: "bad schema"},
		Inbox:  &console.InboxConfig{MaxAttempts: -1},
		Events: &console.EventsConfig{},
		Auth:   console.AuthConfig{Token: "two words"},
	})
	for _, want := range []string{"Outbox.Pool is required", "Outbox.Schema", "Inbox.Pool is required", "Inbox.Consumer is required",
		"Inbox.MaxAttempts must be at least 1", "Events.Pool is required", "Auth.Token must not contain white space"} {
		require.ErrorContains(t, err, want)
	}
}

// TestRequeueFlowWithoutJavaScript walks the console's forms as a browser without scripts
// does: select, confirmation with the ordering caveat, requeue, result.
func TestRequeueFlowWithoutJavaScript(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := deadFixture(t, r)
	list := r.get(t, "/console/outbox").body
	require.Contains(t, list, `value="`+ids["d1"]+`"`)
	require.NotContains(t, list, `name="id" value="`+ids["f1"]+`"`, "failed rows are not requeueable")
	tok := r.csrf(t)

	confirm := r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "id": {ids["d1"], ids["r1"]}}.Encode())
	require.Equal(t, http.StatusOK, confirm.code, confirm.body)
	require.Contains(t, confirm.body, "Requeue 2 row(s)?")
	require.Contains(t, confirm.body, "Ordering caveat")
	require.Contains(t, confirm.body, "AFTER later events of its key")
	// The rows affected, with what an operator decides on: event type, key, attempts, error.
	require.Contains(t, confirm.body, `<div class="sub mono">d1</div></td>
  <td class="mono">A</td>`)
	require.Contains(t, confirm.body, "broker unreachable")
	require.Contains(t, confirm.body, "10 attempts", "the console is not told the relay's ceiling")
	// A row Kafka rejected for good is requeued only once that is acknowledged.
	require.Contains(t, confirm.body, `id="rejected-warning"`)
	require.Contains(t, confirm.body, "message_too_large")
	require.Contains(t, r.get(t, "/api/v1/outbox/rows/"+ids["d1"]).body, `"status": "dead"`, "the confirmation moves nothing")
	unacked := r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "confirm": {"yes"}, "id": {ids["d1"], ids["r1"]}}.Encode())
	require.Equal(t, http.StatusOK, unacked.code, unacked.body)
	require.Contains(t, unacked.body, `id="ack-needed"`)
	require.Contains(t, r.get(t, "/api/v1/outbox/rows/"+ids["r1"]).body, `"status": "rejected"`, "nothing moved without the acknowledgement")

	// The action answers 303 to a page of its outcome: reloading it repeats nothing.
	done := r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "confirm": {"yes"}, "rejected_ok": {"yes"},
		"id": {ids["d1"], ids["r1"]}}.Encode())
	require.Equal(t, http.StatusSeeOther, done.code, done.body)
	result := r.follow(t, done)
	require.Equal(t, http.StatusOK, result.code, result.body)
	require.Contains(t, result.body, "Requeued 2 row(s).")
	require.Contains(t, result.body, `<span class="badge pending">pending</span>`, "the rows as they are now")
	require.Contains(t, r.get(t, "/api/v1/outbox/rows/"+ids["r1"]).body, `"status": "pending"`)
	again := r.follow(t, done)
	require.Equal(t, result.code, again.code)
	require.Equal(t, 1, strings.Count(r.logs.String(), `console: outbox requeue"`), "the reload did not requeue again")
	// A result link the console did not sign is refused.
	forged := strings.Replace(done.header.Get("Location"), "n=2", "n=2000", 1)
	a := r.get(t, forged)
	require.Equal(t, http.StatusBadRequest, a.code)
	require.Contains(t, a.body, "not made by this console")

	// By filter: the confirmation counts what would move.
	filtered := r.get(t, "/console/outbox?destination=payments.v1").body
	require.Contains(t, filtered, "Requeue every dead or rejected row for payments.v1")
	confirm = r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "destination": {"payments.v1"}}.Encode())
	require.Contains(t, confirm.body, "Requeue 1 row(s)?")
	require.Contains(t, confirm.body, "payment")
	require.NotContains(t, confirm.body, `id="rejected-warning"`, "no rejected row for payments.v1")
	done = r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "confirm": {"yes"}, "destination": {"payments.v1"}}.Encode())
	require.Contains(t, r.follow(t, done).body, ids["p1"])

	bad := r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}}.Encode())
	require.Equal(t, http.StatusBadRequest, bad.code)
	require.Contains(t, bad.body, "say which rows")
	bad = r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "id": {"x"}}.Encode())
	require.Equal(t, http.StatusBadRequest, bad.code)
}

func TestRetryFlowWithoutJavaScript(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	r.process(t, event("a/b:c", "orders.v1", ptr("B"), `{"n":"poison"}`), 0, 2)
	list := r.get(t, "/console/inbox").body
	require.Contains(t, list, "poisoned")
	key := "orders/" + url.PathEscape("a/b:c")
	require.Contains(t, list, `value="`+strings.ReplaceAll(key, ":", ":")+`"`)
	tok := r.csrf(t)

	confirm := r.postForm(t, "/console/inbox/retry", url.Values{"csrf_token": {tok}, "key": {key}}.Encode())
	require.Equal(t, http.StatusOK, confirm.code, confirm.body)
	require.Contains(t, confirm.body, "Retry 1 message(s)")
	require.Contains(t, confirm.body, `orders / <span class="mono">a/b:c</span>`)
	require.Contains(t, confirm.body, "cannot bill a/b:c: payload is poison", "the error the retry is about")
	require.Contains(t, confirm.body, "1 of 1", "attempts against the consumer's ceiling")
	r.fix()
	done := r.postForm(t, "/console/inbox/retry", url.Values{"csrf_token": {tok}, "confirm": {"yes"}, "key": {key}}.Encode())
	result := r.follow(t, done)
	require.Contains(t, result.body, "1 of 1 message(s) processed.")
	require.Contains(t, result.body, "processed")
	require.Contains(t, r.follow(t, done).body, "1 of 1 message(s) processed.", "a reload shows the outcome again")
	require.Equal(t, 1, strings.Count(r.logs.String(), `console: inbox retry"`), "and retries nothing")
	require.Contains(t, r.get(t, "/console/inbox/"+key).body, "completed")

	bad := r.postForm(t, "/console/inbox/retry", url.Values{"csrf_token": {tok}, "key": {"no-slash"}}.Encode())
	require.Equal(t, http.StatusBadRequest, bad.code)
	bad = r.postForm(t, "/console/inbox/retry", url.Values{"csrf_token": {tok}}.Encode())
	require.Equal(t, http.StatusBadRequest, bad.code)
}

// TestDecisionContext: attempts against the relay's ceiling, times in UTC beside how long ago,
// and the lists' live part served alone for the refresh script.
func TestDecisionContext(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *console.Config) { c.Outbox.MaxAttempts = 10 })
	ids := deadFixture(t, r)
	r.exec(t, `UPDATE keiro_outbox SET updated_at = now() - interval '4 minutes 10 seconds' WHERE message_id = 'd1'`)
	list := r.get(t, "/console/outbox").body
	require.Contains(t, list, "10 of 10")
	require.Contains(t, list, "1 of 10")
	require.Regexp(t, `<time datetime="[0-9T:-]+Z">[0-9-]+ [0-9:]+Z</time> <span class="rel">4 min ago</span>`, list)
	require.Contains(t, r.get(t, "/console/outbox/"+ids["d1"]).body, `<dd id="attempts">10 of 10</dd>`)
	require.Contains(t, list, `data-refresh="5"`)
	require.Contains(t, list, `<div id="live">`)

	frag := r.get(t, "/console/outbox?status=dead&fragment=live")
	require.Equal(t, http.StatusOK, frag.code)
	require.NotContains(t, frag.body, "<html")
	require.NotContains(t, frag.body, `<form`, "the live part sits inside the page's form")
	require.Contains(t, frag.body, `id="outbox-rows"`)
	require.Contains(t, frag.body, ids["d1"])
	require.NotContains(t, frag.body, ids["r1"], "the page's filter applies")
	for _, path := range []string{"/console/?fragment=live", "/console/inbox?fragment=live", "/console/subscriptions?fragment=live"} {
		a := r.get(t, path)
		require.Equal(t, http.StatusOK, a.code, path)
		require.NotContains(t, a.body, "<html", path)
	}
	require.Contains(t, r.get(t, "/console/nope?fragment=live").body, "<html", "errors are whole pages")
	require.Contains(t, r.get(t, "/console/").header.Get("Content-Security-Policy"), "connect-src 'self'", "the refresh script's fetch")

	// The empty state reads as a sentence.
	require.Contains(t, r.get(t, "/console/outbox?status=failed&destination=none").body, "No failed rows for none.")
	r.exec(t, `DELETE FROM keiro_outbox`)
	require.Contains(t, r.get(t, "/console/outbox").body, "No dead or rejected rows.")
	require.Contains(t, r.get(t, "/console/outbox?status=dead,rejected,failed").body, "No dead, rejected or failed rows.")
}

// TestHeadingOrder: every page has one h1 first, and no heading skips a level on the way down.
func TestHeadingOrder(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := deadFixture(t, r)
	r.process(t, event("bad-1", "orders.v1", ptr("B"), `{"n":"poison"}`), 0, 2)
	tok := r.csrf(t)
	heading := regexp.MustCompile(`<h([1-6])[ >]`)
	check := func(what, body string) {
		t.Helper()
		levels := heading.FindAllStringSubmatch(body, -1)
		require.NotEmpty(t, levels, what)
		require.Equal(t, "1", levels[0][1], what+": the first heading is h1")
		prev := 1
		for _, m := range levels[1:] {
			n := int(m[1][0] - '0')
			require.NotEqual(t, 1, n, what+": one h1")
			require.LessOrEqual(t, n, prev+1, what+": h%d after h%d", n, prev)
			prev = n
		}
	}
	for _, path := range []string{"/console/", "/console/outbox", "/console/outbox/" + ids["d1"], "/console/inbox",
		"/console/inbox/orders/bad-1", "/console/subscriptions", "/console/search?q=d1", "/console/nope"} {
		check(path, r.get(t, path).body)
	}
	check("requeue confirmation", r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "id": {ids["d1"]}}.Encode()).body)
	check("retry confirmation", r.postForm(t, "/console/inbox/retry", url.Values{"csrf_token": {tok}, "key": {"orders/bad-1"}}.Encode()).body)
	done := r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "confirm": {"yes"}, "id": {ids["d1"]}}.Encode())
	check("requeue result", r.follow(t, done).body)
	// A console with the subscriptions only still starts its sections at h2.
	events := newRig(t, func(c *console.Config) { c.Outbox, c.Inbox = nil, nil })
	check("events overview", events.get(t, "/console/").body)
}

// TestErrorPages: styled, with advice that fits how the console runs.
func TestErrorPages(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	a := r.get(t, "/console/nope")
	require.Equal(t, http.StatusNotFound, a.code)
	require.Contains(t, a.body, `<link rel="stylesheet" href="/console/assets/console.css">`)
	require.Contains(t, a.body, `id="error-advice"`)
	require.Contains(t, a.body, `<a href="/console/search">Find a message</a>`)

	relay := newRig(t, func(c *console.Config) { c.Inbox = nil })
	a = relay.get(t, "/console/inbox")
	require.Equal(t, http.StatusNotFound, a.code)
	require.Contains(t, a.body, "the consumer serves the inbox")
	require.NotContains(t, a.body, `href="/console/inbox"`)

	ro := newRig(t, func(c *console.Config) { c.ReadOnly = true })
	a = ro.postForm(t, "/console/outbox/requeue", "id=x&csrf_token="+ro.csrf(t))
	require.Equal(t, http.StatusForbidden, a.code)
	require.Contains(t, a.body, "restart it without --admin-read-only")

	stale := r.postForm(t, "/console/outbox/requeue", "id=x&csrf_token=old")
	require.Equal(t, http.StatusForbidden, stale.code)
	require.Contains(t, stale.body, "reload the page with the form")

	off := newRig(t, func(c *console.Config) { c.Auth = console.AuthConfig{} })
	a = off.get(t, "/console/")
	require.Equal(t, http.StatusForbidden, a.code)
	require.Contains(t, a.body, "bind --http-addr to 127.0.0.1")
	require.NotContains(t, a.body, `href="/console/outbox">Outbox</a> ·`, "no page is offered where none is served")

	tokened := newRig(t, func(c *console.Config) { c.Auth = console.AuthConfig{Token: token} })
	a = tokened.get(t, "/console/")
	require.Equal(t, http.StatusUnauthorized, a.code)
	require.Contains(t, a.body, "admin token as the password")

	// A database that fails: 500 with where to look.
	broken := newRig(t, nil)
	broken.exec(t, `DROP TABLE keiro_outbox CASCADE`)
	a = broken.get(t, "/console/outbox")
	require.Equal(t, http.StatusInternalServerError, a.code)
	require.Contains(t, a.body, "/readyz says which")
}
