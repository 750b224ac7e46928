package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/console"
)

func TestSearch(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := deadFixture(t, r)
	r.process(t, event("d1", "orders.v1", ptr("A"), `{"n":"poison"}`), 0, 4)
	ok := event("in-7", "orders.v1", ptr("A"), `{"n":7}`)
	ok.EventType = "OrderShipped"
	r.process(t, ok, 0, 5)

	search := func(q string) console.SearchAnswer {
		t.Helper()
		var ans console.SearchAnswer
		a := r.get(t, "/api/v1/search?q="+url.QueryEscape(q))
		require.Equal(t, http.StatusOK, a.code, a.body)
		a.json(t, &ans)
		return ans
	}
	// By message id: the outbox row and the inbox message of that id.
	ans := search(" d1 ")
	require.Equal(t, "d1", ans.Query)
	require.Len(t, ans.Outbox, 1)
	require.Equal(t, ids["d1"], ans.Outbox[0].OutboxID)
	require.Equal(t, "dead", ans.Outbox[0].Status)
	require.Equal(t, []string{"message_id"}, ans.Outbox[0].Matched)
	require.Len(t, ans.Inbox, 1)
	require.Equal(t, "d1", ans.Inbox[0].MessageID)
	require.True(t, ans.Inbox[0].Poisoned)
	require.ElementsMatch(t, []string{"dedupe_key", "message_id"}, ans.Inbox[0].Matched)

	// By key: in every status, newest first; the inbox's completed messages too.
	ans = search("A")
	require.Len(t, ans.Outbox, 1)
	require.Equal(t, []string{"key"}, ans.Outbox[0].Matched)
	require.Len(t, ans.Inbox, 2)
	require.Equal(t, "in-7", ans.Inbox[0].MessageID, "newest received first")
	require.Equal(t, "completed", ans.Inbox[0].Status)
	// By event type and by source; sent rows are found.
	ans = search("OrderShipped")
	require.Empty(t, ans.Outbox)
	require.Len(t, ans.Inbox, 1)
	ans = search("orders")
	require.Len(t, ans.Outbox, 7)
	require.Equal(t, ids["q1"], ans.Outbox[0].OutboxID, "newest first")
	require.Contains(t, statuses(ans.Outbox), "sent")
	// By outbox id.
	ans = search(ids["r1"])
	require.Len(t, ans.Outbox, 1)
	require.Equal(t, []string{"outbox_id"}, ans.Outbox[0].Matched)
	// Paged: more than the limit says so.
	var paged console.SearchAnswer
	r.get(t, "/api/v1/search?q=orders&limit=2").json(t, &paged)
	require.Len(t, paged.Outbox, 2)
	require.True(t, paged.OutboxMore)
	// Nothing.
	ans = search("no-such-thing")
	require.Empty(t, ans.Outbox)
	require.Empty(t, ans.Inbox)

	// Bad input.
	a := r.get(t, "/api/v1/search")
	require.Equal(t, http.StatusBadRequest, a.code)
	require.Contains(t, a.body, "say what to find")
	a = r.get(t, "/api/v1/search?q="+strings.Repeat("x", console.MaxSearchTermBytes+1))
	require.Equal(t, http.StatusBadRequest, a.code)
	require.Contains(t, a.body, "at most 512 bytes")

	// The page: the box in every page's header, the results linking to the rows.
	require.Contains(t, r.get(t, "/console/").body, `action="/console/search"`)
	page := r.get(t, "/console/search?q=d1")
	require.Equal(t, http.StatusOK, page.code, page.body)
	require.Contains(t, page.body, `href="/console/outbox/`+ids["d1"]+`"`)
	require.Contains(t, page.body, `href="/console/inbox/orders/d1"`)
	require.Contains(t, r.get(t, "/console/search?q=no-such-thing").body, "is named no-such-thing")
	require.Equal(t, http.StatusOK, r.get(t, "/console/search").code, "the empty search box")

	// The relay's console searches its outbox only; one with neither says why.
	relay := newRig(t, func(c *console.Config) { c.Inbox = nil })
	var ro console.SearchAnswer
	relay.get(t, "/api/v1/search?q=x").json(t, &ro)
	require.NotNil(t, ro.Outbox)
	require.Nil(t, ro.Inbox)
	events := newRig(t, func(c *console.Config) { c.Inbox, c.Outbox = nil, nil })
	a = events.get(t, "/api/v1/search?q=x")
	require.Equal(t, http.StatusNotFound, a.code)
	require.Contains(t, a.body, "neither is configured")
}

func statuses(hits []console.OutboxHit) []string {
	var out []string
	for _, h := range hits {
		out = append(out, h.Status)
	}
	return out
}

// TestOldestPendingLinksToRow: the overview's oldest pending figure opens the row at the head of
// the queue.
func TestOldestPendingLinksToRow(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := deadFixture(t, r)
	var s console.OutboxSummary
	r.get(t, "/api/v1/outbox/summary").json(t, &s)
	require.Equal(t, ids["f1"], s.OldestPendingID, "f1 (failed) is the lowest seq still to publish")
	require.Contains(t, r.get(t, "/console/").body, `<span class="value" id="oldest-pending"><a href="/console/outbox/`+ids["f1"]+`">`)
}
