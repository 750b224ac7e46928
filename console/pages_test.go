package console_test

import (
	"net/http"
	"net/url"
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
	require.Contains(t, r.get(t, "/api/v1/outbox/rows/"+ids["d1"]).body, `"status": "dead"`, "the confirmation moves nothing")

	done := r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "confirm": {"yes"}, "id": {ids["d1"], ids["r1"]}}.Encode())
	require.Equal(t, http.StatusOK, done.code, done.body)
	require.Contains(t, done.body, "Requeued 2 row(s).")
	require.Contains(t, r.get(t, "/api/v1/outbox/rows/"+ids["r1"]).body, `"status": "pending"`)

	// By filter: the confirmation counts what would move.
	filtered := r.get(t, "/console/outbox?destination=payments.v1").body
	require.Contains(t, filtered, "Requeue every dead or rejected row for payments.v1")
	confirm = r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "destination": {"payments.v1"}}.Encode())
	require.Contains(t, confirm.body, "Requeue 1 row(s)?")
	done = r.postForm(t, "/console/outbox/requeue", url.Values{"csrf_token": {tok}, "confirm": {"yes"}, "destination": {"payments.v1"}}.Encode())
	require.Contains(t, done.body, ids["p1"])

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
	require.Contains(t, confirm.body, "orders / a/b:c")
	r.fix()
	done := r.postForm(t, "/console/inbox/retry", url.Values{"csrf_token": {tok}, "confirm": {"yes"}, "key": {key}}.Encode())
	require.Equal(t, http.StatusOK, done.code, done.body)
	require.Contains(t, done.body, "1 of 1 message(s) processed.")
	require.Contains(t, r.get(t, "/console/inbox/"+key).body, "completed")

	bad := r.postForm(t, "/console/inbox/retry", url.Values{"csrf_token": {tok}, "key": {"no-slash"}}.Encode())
	require.Equal(t, http.StatusBadRequest, bad.code)
	bad = r.postForm(t, "/console/inbox/retry", url.Values{"csrf_token": {tok}}.Encode())
	require.Equal(t, http.StatusBadRequest, bad.code)
}
