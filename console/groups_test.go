package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/console"
)

// TestFailureGroups groups dead outbox rows and failed inbox messages by error class and
// normalised message (ids and numbers out), requeues one outbox group and retries one inbox
// group, through the API and through the pages' confirmations.
func TestFailureGroups(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := r.enqueue(t,
		event("m1", "payments.v1", ptr("a"), `{}`), event("m2", "payments.v1", ptr("b"), `{}`),
		event("m3", "refunds.v1", ptr("c"), `{}`), event("m4", "payments.v1", ptr("d"), `{}`),
		event("m5", "payments.v1", ptr("e"), `{}`))
	dead := func(id, msg string) {
		r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'dead', attempt_count = 10, last_error = $2 WHERE outbox_id = $1`, r.db.Schema), id, msg)
	}
	dead(ids[0], "produce to payments.v1: record 4711 of batch 3 too old (offset 12)")
	dead(ids[1], "produce to payments.v1: record 99 of batch 1 too old (offset 7)")
	dead(ids[2], "produce to refunds.v1: record 5 of batch 2 too old (offset 1)")
	dead(ids[3], "broker 0b7a5c3e-1d2f-4a6b-9c8d-7e6f5a4b3c2d unreachable")
	r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'rejected', rejected_at = now(), rejection_code = 'message_too_large',
		last_error = 'record of 2000000 bytes' WHERE outbox_id = $1`, r.db.Schema), ids[4])

	var groups console.FailureGroups
	a := r.get(t, "/api/v1/outbox/groups")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &groups)
	require.Len(t, groups.Groups, 4, a.body)
	g := groups.Groups[0]
	require.Equal(t, "dead", g.Class)
	require.Equal(t, "produce to payments.v1: record <n> of batch <n> too old (offset <n>)", g.Message)
	require.EqualValues(t, 2, g.Count)
	require.Equal(t, []string{"payments.v1"}, g.Where)
	require.Equal(t, []string{"OrderPlaced"}, g.EventTypes)
	var classes, messages []string
	for _, g := range groups.Groups {
		classes, messages = append(classes, g.Class), append(messages, g.Message)
	}
	require.Contains(t, classes, "rejected: message_too_large")
	require.Contains(t, messages, "broker <id> unreachable")

	// Requeue the largest group through the API: its two rows move, the others stay.
	var rq struct {
		Requeued  []string `json:"requeued"`
		Remaining bool     `json:"remaining"`
	}
	a = r.postJSON(t, "/api/v1/outbox/groups/requeue", g.Ref())
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &rq)
	require.ElementsMatch(t, []string{ids[0], ids[1]}, rq.Requeued)
	require.False(t, rq.Remaining)
	require.Equal(t, http.StatusNotFound, r.postJSON(t, "/api/v1/outbox/groups/requeue", g.Ref()).code, "the group is empty now")
	require.Equal(t, http.StatusBadRequest, r.postJSON(t, "/api/v1/outbox/groups/requeue", console.GroupRef{}).code)

	// The page lists the groups; a group's button opens the ordinary confirmation of its rows.
	page := r.get(t, "/console/outbox/groups")
	require.Equal(t, http.StatusOK, page.code, page.body)
	require.Contains(t, page.body, "broker &lt;id&gt; unreachable")
	form := url.Values{"csrf_token": {r.csrf(t)}, "class": {"dead"}, "message": {"broker <id> unreachable"}}
	conf := r.postForm(t, "/console/outbox/groups/requeue", form.Encode())
	require.Equal(t, http.StatusOK, conf.code, conf.body)
	require.Contains(t, conf.body, ids[3])
	require.NotContains(t, conf.body, ids[2])
	require.Contains(t, conf.body, `name="confirm" value="yes"`)

	// Inbox: two poisoned messages whose errors differ only by their ids form one group.
	r.process(t, event("p-1", "orders.v1", ptr("k1"), `{"poison":1}`), 0, 10)
	r.process(t, event("p-2", "orders.v1", ptr("k2"), `{"poison":2}`), 0, 11)
	a = r.get(t, "/api/v1/inbox/groups")
	require.Equal(t, http.StatusOK, a.code, a.body)
	groups = console.FailureGroups{}
	a.json(t, &groups)
	require.Len(t, groups.Groups, 1, a.body)
	ig := groups.Groups[0]
	require.Equal(t, "poisoned", ig.Class)
	require.EqualValues(t, 2, ig.Count)
	require.Equal(t, "permanent: cannot bill p-<n>: payload is poison", ig.Message)
	require.Equal(t, []string{"orders"}, ig.Where)

	conf = r.postForm(t, "/console/inbox/groups/retry", url.Values{"csrf_token": {r.csrf(t)}, "class": {ig.Class}, "message": {ig.Message}}.Encode())
	require.Equal(t, http.StatusOK, conf.code, conf.body)
	require.Contains(t, conf.body, "Retry 2 message(s)")

	r.fix()
	var ans console.RetryAnswer
	a = r.postJSON(t, "/api/v1/inbox/groups/retry", ig.Ref())
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &ans)
	require.Equal(t, 2, ans.Succeeded, a.body)
	groups = console.FailureGroups{}
	r.get(t, "/api/v1/inbox/groups").json(t, &groups)
	require.Empty(t, groups.Groups)
	require.True(t, strings.Contains(r.get(t, "/console/inbox/groups").body, `id="no-groups"`))
}

// TestAttemptHistoryShown: a row's page and its API answer list its failed attempts.
func TestAttemptHistoryShown(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	r.process(t, event("h-1", "orders.v1", ptr("k1"), `{"poison":1}`), 0, 1)
	var e console.InboxEntry
	a := r.get(t, "/api/v1/inbox/failed/orders/h-1")
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &e)
	require.Len(t, e.AttemptHistory, 1)
	require.Equal(t, 1, e.AttemptHistory[0].Attempt)
	require.Contains(t, e.AttemptHistory[0].Error, "payload is poison")
	page := r.get(t, "/console/inbox/orders/h-1").body
	require.Regexp(t, `(?s)id="attempt-history".*1 of 1.*payload is poison`, page)

	ids := r.enqueue(t, event("o-1", "payments.v1", ptr("k"), `{}`))
	r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'rejected', rejected_at = now(), rejection_code = 'message_too_large',
		attempt_count = 2, last_error = 'too large', attempt_errors = '[{"attempt":1,"at":"2026-12-01T10:00:00Z","error":"broker <down>"},
		{"attempt":2,"at":"2026-12-01T10:01:00Z","error":"too large","code":"message_too_large"}]' WHERE outbox_id = $1`, r.db.Schema), ids[0])
	var o console.OutboxRow
	r.get(t, "/api/v1/outbox/rows/"+ids[0]).json(t, &o)
	require.Len(t, o.AttemptHistory, 2)
	require.Equal(t, "message_too_large", o.AttemptHistory[1].Code)
	page = r.get(t, "/console/outbox/"+ids[0]).body
	require.Regexp(t, `(?s)id="attempt-history".*broker &lt;down&gt;.*message_too_large`, page)
	var list console.OutboxPage
	r.get(t, "/api/v1/outbox/rows").json(t, &list)
	require.Nil(t, list.Rows[0].AttemptHistory, "lists carry no history")
}
