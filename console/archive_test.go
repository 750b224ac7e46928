package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/console"
)

// TestArchive archives a dead outbox row from the list's selection (confirmation, 303, result)
// and an inbox group through the API: the archived rows leave the working lists and the
// groups, and stay in the archived lists and in search.
func TestArchive(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := r.enqueue(t, event("a1", "payments.v1", ptr("k1"), `{}`), event("a2", "payments.v1", ptr("k2"), `{}`))
	r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'dead', attempt_count = 3, last_error = 'test order, ignore'`, r.db.Schema))

	tok := r.csrf(t)
	conf := r.postForm(t, "/console/outbox/archive", url.Values{"csrf_token": {tok}, "id": {ids[0]}}.Encode())
	require.Equal(t, http.StatusOK, conf.code, conf.body)
	require.Contains(t, conf.body, "Archive 1 row(s)?")
	require.Contains(t, conf.body, "test order, ignore")
	res := r.follow(t, r.postForm(t, "/console/outbox/archive", url.Values{"csrf_token": {tok}, "id": {ids[0]}, "confirm": {"yes"}}.Encode()))
	require.Equal(t, http.StatusOK, res.code, res.body)
	require.Contains(t, res.body, "1 row(s) archived")

	var page console.OutboxPage
	r.get(t, "/api/v1/outbox/rows").json(t, &page)
	require.Len(t, page.Rows, 1)
	require.Equal(t, ids[1], page.Rows[0].OutboxID)
	page = console.OutboxPage{}
	r.get(t, "/api/v1/outbox/rows?archived=true").json(t, &page)
	require.Len(t, page.Rows, 1)
	require.Equal(t, ids[0], page.Rows[0].OutboxID)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/api/v1/outbox/rows?archived=maybe").code)
	var groups console.FailureGroups
	r.get(t, "/api/v1/outbox/groups").json(t, &groups)
	require.Len(t, groups.Groups, 1)
	require.EqualValues(t, 1, groups.Groups[0].Count, "the archived row left its group")
	require.Contains(t, r.get(t, "/api/v1/search?q=a1").body, ids[0], "an archived row stays searchable")
	require.Contains(t, r.get(t, "/console/outbox?archived=true").body, `id="working-link"`)

	// Archiving again names nothing new; both rows and a group at once is refused.
	var ans console.ArchiveAnswer
	a := r.postJSON(t, "/api/v1/outbox/archive", console.OutboxArchiveRequest{IDs: []string{ids[0]}})
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &ans)
	require.Zero(t, ans.Archived)
	require.Equal(t, 1, ans.NotArchived)
	require.Equal(t, http.StatusBadRequest, r.postJSON(t, "/api/v1/outbox/archive", console.OutboxArchiveRequest{IDs: []string{ids[1]}, Class: "dead"}).code)
	require.Equal(t, http.StatusBadRequest, r.postJSON(t, "/api/v1/outbox/archive", console.OutboxArchiveRequest{}).code)

	// Inbox: a group archived through the API.
	r.process(t, event("p-1", "orders.v1", ptr("k1"), `{"poison":1}`), 0, 1)
	r.process(t, event("p-2", "orders.v1", ptr("k2"), `{"poison":2}`), 0, 2)
	groups = console.FailureGroups{}
	r.get(t, "/api/v1/inbox/groups").json(t, &groups)
	require.Len(t, groups.Groups, 1)
	ans = console.ArchiveAnswer{}
	a = r.postJSON(t, "/api/v1/inbox/archive", console.InboxArchiveRequest{Class: groups.Groups[0].Class, Message: groups.Groups[0].Message})
	require.Equal(t, http.StatusOK, a.code, a.body)
	a.json(t, &ans)
	require.Equal(t, 2, ans.Archived)
	var failed console.InboxPage
	r.get(t, "/api/v1/inbox/failed").json(t, &failed)
	require.Empty(t, failed.Rows)
	r.get(t, "/api/v1/inbox/failed?archived=true").json(t, &failed)
	require.Len(t, failed.Rows, 2)
	groups = console.FailureGroups{}
	r.get(t, "/api/v1/inbox/groups").json(t, &groups)
	require.Empty(t, groups.Groups)
	// The summary counts them apart: nothing poisoned is left for an operator.
	var summary console.InboxSummary
	r.get(t, "/api/v1/inbox/summary").json(t, &summary)
	for _, cc := range summary.Consumers {
		if cc.Consumer == summary.Consumer {
			require.Zero(t, cc.Poisoned+cc.Retrying, "%+v", cc)
			require.EqualValues(t, 2, cc.Archived, "%+v", cc)
			require.Nil(t, cc.OldestFailureAgeSeconds)
		}
	}
	require.Contains(t, r.get(t, "/console/").body, `<a href="/console/inbox?archived=true">2</a>`)
	require.Equal(t, http.StatusNotFound, r.postJSON(t, "/api/v1/inbox/archive",
		console.InboxArchiveRequest{Class: "poisoned", Message: "permanent: cannot bill p-<n>: payload is poison"}).code)
	list := r.get(t, "/console/inbox?archived=true")
	require.Contains(t, list.body, "p-1")
	require.Contains(t, r.logs.String(), "inbox archive")
}
