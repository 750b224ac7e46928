package console_test

import (
	"encoding/base64"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/console"
)

const token = "s3cret-admin-token"

func TestAuthentication(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *console.Config) { c.Auth = console.AuthConfig{Token: token, AllowUnauthenticated: true} })
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	for _, path := range []string{"/api/v1/outbox/summary", "/console/", "/console/outbox", "/api/v1/inbox/failed"} {
		a := r.get(t, path)
		require.Equal(t, http.StatusUnauthorized, a.code, path+" without credentials, loopback or not, once a token is set")
		require.Contains(t, a.header.Get("WWW-Authenticate"), "Basic")
		require.NotContains(t, a.body, token)

		a = r.do(t, http.MethodGet, path, nil, map[string]string{"Authorization": "Bearer wrong"})
		require.Equal(t, http.StatusUnauthorized, a.code, path)
		require.Contains(t, a.body, "does not match")
		a = r.do(t, http.MethodGet, path, nil, map[string]string{"Authorization": basic("ops", "wrong")})
		require.Equal(t, http.StatusUnauthorized, a.code, path)

		a = r.do(t, http.MethodGet, path, nil, map[string]string{"Authorization": "Bearer " + token})
		require.Equal(t, http.StatusOK, a.code, path)
		a = r.do(t, http.MethodGet, path, nil, map[string]string{"Authorization": basic("alice", token)})
		require.Equal(t, http.StatusOK, a.code, path)
	}
	require.Contains(t, r.get(t, "/console/").body, "", "")
	page := r.do(t, http.MethodGet, "/console/", nil, map[string]string{"Authorization": basic("alice", token)})
	require.Contains(t, page.body, "basic:alice")

	// A bearer request needs no CSRF token (browsers never send one on their own); the action is
	// logged with who did it.
	ids := deadFixture(t, r)
	a := r.do(t, http.MethodPost, "/api/v1/outbox/requeue", strings.NewReader(`{"ids":["`+ids["d1"]+`"]}`),
		map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"})
	require.Equal(t, http.StatusOK, a.code, a.body)
	require.Regexp(t, `console: outbox requeue" who=token`, r.logs.String())
	// Basic auth is sent by browsers on their own: it needs the CSRF token.
	a = r.do(t, http.MethodPost, "/api/v1/outbox/requeue", strings.NewReader(`{"ids":["`+ids["d2"]+`"]}`),
		map[string]string{"Authorization": basic("alice", token), "Content-Type": "application/json"})
	require.Equal(t, http.StatusForbidden, a.code, a.body)
	require.NotContains(t, r.logs.String(), token, "the token is never logged")
}

// TestRefusedOffLoopbackWithoutToken: bound elsewhere and without a token, nothing is served.
func TestRefusedOffLoopbackWithoutToken(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *console.Config) { c.Auth = console.AuthConfig{} })
	for _, path := range []string{"/api/v1/outbox/summary", "/console/"} {
		a := r.get(t, path)
		require.Equal(t, http.StatusForbidden, a.code)
		require.Contains(t, a.body, "--admin-token")
	}
	require.Contains(t, r.logs.String(), "request refused")
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:9464": true, "127.1.2.3:80": true, "[::1]:9464": true, "localhost:9464": true,
		"0.0.0.0:9464": false, ":9464": false, "10.0.0.5:9464": false, "[::]:9464": false, "example.com:80": false, "nonsense": false,
	} {
		require.Equal(t, want, console.IsLoopback(addr), addr)
	}
}

func TestCSRF(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := deadFixture(t, r)
	body := `{"ids":["` + ids["d1"] + `"]}`
	post := func(hdr map[string]string) answer {
		return r.do(t, http.MethodPost, "/api/v1/outbox/requeue", strings.NewReader(body), hdr)
	}
	tok := r.csrf(t)

	// API.
	a := post(map[string]string{"Content-Type": "text/plain", "X-CSRF-Token": tok})
	require.Equal(t, http.StatusForbidden, a.code, "a form-encodable body is refused")
	require.Contains(t, a.body, "application/json")
	a = post(map[string]string{"Content-Type": "application/json"})
	require.Equal(t, http.StatusForbidden, a.code)
	require.Contains(t, a.body, "X-CSRF-Token")
	a = post(map[string]string{"Content-Type": "application/json", "X-CSRF-Token": "forged"})
	require.Equal(t, http.StatusForbidden, a.code)
	a = post(map[string]string{"Content-Type": "application/json", "X-CSRF-Token": tok, "Origin": "https://evil.example"})
	require.Equal(t, http.StatusForbidden, a.code)
	require.Contains(t, a.body, "cross-site")
	a = r.do(t, http.MethodGet, "/api/v1/outbox/rows/"+ids["d1"], nil, nil)
	require.Contains(t, a.body, `"status": "dead"`, "nothing moved so far")
	a = post(map[string]string{"Content-Type": "application/json", "X-CSRF-Token": tok, "Origin": r.srv.URL})
	require.Equal(t, http.StatusOK, a.code, a.body)

	// Console forms: same origin and the form token.
	form := "confirm=yes&id=" + ids["d2"]
	formPost := func(hdr map[string]string, f string) answer {
		hdr["Content-Type"] = "application/x-www-form-urlencoded"
		return r.do(t, http.MethodPost, "/console/outbox/requeue", strings.NewReader(f), hdr)
	}
	a = formPost(map[string]string{}, form+"&csrf_token="+tok)
	require.Equal(t, http.StatusForbidden, a.code, "no Origin nor Referer")
	require.Contains(t, a.body, "neither Origin nor Referer")
	a = formPost(map[string]string{"Origin": "http://evil.example"}, form+"&csrf_token="+tok)
	require.Equal(t, http.StatusForbidden, a.code)
	a = formPost(map[string]string{"Origin": "null"}, form+"&csrf_token="+tok)
	require.Equal(t, http.StatusForbidden, a.code)
	a = formPost(map[string]string{"Referer": "http://evil.example/console/"}, form+"&csrf_token="+tok)
	require.Equal(t, http.StatusForbidden, a.code)
	a = formPost(map[string]string{"Origin": r.srv.URL}, form)
	require.Equal(t, http.StatusForbidden, a.code, "no form token")
	require.Contains(t, a.body, "form token")
	a = formPost(map[string]string{"Origin": r.srv.URL}, form+"&csrf_token=forged")
	require.Equal(t, http.StatusForbidden, a.code)
	require.Contains(t, r.logs.String(), "action refused")
	require.Contains(t, r.get(t, "/api/v1/outbox/rows/"+ids["d2"]).body, `"status": "dead"`)

	a = formPost(map[string]string{"Referer": r.srv.URL + "/console/outbox"}, form+"&csrf_token="+tok)
	require.Equal(t, http.StatusSeeOther, a.code, a.body)
	require.Contains(t, r.follow(t, a).body, "Requeued 1 row(s)")
	require.Contains(t, r.get(t, "/api/v1/outbox/rows/"+ids["d2"]).body, `"status": "pending"`)

	// Only POST changes state.
	require.Equal(t, http.StatusNotFound, r.get(t, "/api/v1/outbox/requeue").code)
	require.Equal(t, http.StatusBadRequest, r.get(t, "/console/outbox/requeue").code, "read as a row id")
	require.Contains(t, r.get(t, "/api/v1/outbox/rows/"+ids["p1"]).body, `"status": "dead"`)
	// A form body over the limit is refused before it is read whole.
	big := "csrf_token=" + tok + "&id=" + strings.Repeat("a", console.MaxRequestBytes)
	a = formPost(map[string]string{"Origin": r.srv.URL}, big)
	require.Equal(t, http.StatusRequestEntityTooLarge, a.code)
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *console.Config) { c.ReadOnly = true })
	ids := deadFixture(t, r)
	r.process(t, event("bad-1", "orders.v1", ptr("B"), `{"n":"poison"}`), 0, 2)
	a := r.postJSON(t, "/api/v1/outbox/requeue", console.RequeueRequest{All: true})
	require.Equal(t, http.StatusForbidden, a.code)
	require.Contains(t, a.body, "read-only")
	a = r.postJSON(t, "/api/v1/inbox/retry", console.RetryRequest{All: true})
	require.Equal(t, http.StatusForbidden, a.code)
	a = r.postForm(t, "/console/outbox/requeue", "confirm=yes&id="+ids["d1"]+"&csrf_token="+r.csrf(t))
	require.Equal(t, http.StatusForbidden, a.code)
	for _, path := range []string{"/console/outbox", "/console/outbox/" + ids["d1"], "/console/inbox", "/console/inbox/orders/bad-1"} {
		body := r.get(t, path).body
		require.Contains(t, body, "read-only", path)
		require.NotContains(t, body, `<button type="submit" id="requeue`, path)
		require.NotContains(t, body, `<button type="submit" id="retry`, path)
	}
}

// TestEscaping: stored text (payload, headers, errors, keys) is rendered as text, never markup.
func TestEscaping(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	const evil = `<script>alert("x")</script>`
	ev := event(`m<script>1</script>`, "orders.v1", ptr(evil), `{"note":"`+strings.ReplaceAll(evil, `"`, `\"`)+`"}`)
	ev.EventType = `Order<img src=x onerror=alert(1)>`
	ids := r.enqueue(t, ev)
	r.exec(t, `UPDATE keiro_outbox SET status = 'dead', last_error = $1`, evil)
	iev := event(evil, "orders.v1", ptr("k"), `poison `+evil)
	iev.ContentType = "text/plain"
	r.process(t, iev, 0, 1)

	scriptTag := regexp.MustCompile(`(?i)<script>alert|<img src=x`)
	for _, path := range []string{"/console/", "/console/outbox", "/console/outbox/" + ids[0], "/console/inbox",
		"/console/inbox/orders/" + strings.ReplaceAll(evil, "/", "%2F")} {
		a := r.get(t, path)
		require.Equal(t, http.StatusOK, a.code, path+": "+a.body)
		require.False(t, scriptTag.MatchString(a.body), path+" renders stored markup:\n"+a.body)
	}
	detail := r.get(t, "/console/outbox/"+ids[0]).body
	require.Contains(t, detail, `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`)
	require.Contains(t, detail, "Content-Security-Policy"[:0])
	require.Contains(t, r.get(t, "/console/outbox/"+ids[0]).header.Get("Content-Security-Policy"), "script-src 'self'")
	// The API carries the same bytes as JSON text.
	var row console.OutboxRow
	r.get(t, "/api/v1/outbox/rows/"+ids[0]).json(t, &row)
	require.Equal(t, evil, row.LastError)
}

// TestDNSRebinding: without a token, a request naming another host is refused before anything
// is read or done, for pages, the API and actions alike; loopback names are served.
func TestDNSRebinding(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ids := deadFixture(t, r)
	const evil = "evil.example:9477"
	hostile := func(method, path, body string, hdr map[string]string) answer {
		t.Helper()
		req, err := http.NewRequest(method, r.srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Host = evil
		req.Header.Set("Origin", "http://"+evil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return answer{code: resp.StatusCode, body: string(b), header: resp.Header}
	}
	for _, path := range []string{"/console/", "/console/outbox/" + ids["d1"], "/api/v1/outbox/rows/" + ids["d1"], "/api/v1/outbox/summary"} {
		a := hostile(http.MethodGet, path, "", nil)
		require.Equal(t, http.StatusMisdirectedRequest, a.code, path)
		require.Contains(t, a.body, "does not name loopback", path)
		if !strings.HasPrefix(path, "/api/") {
			require.Contains(t, a.body, "http://127.0.0.1:9477/console/", path+": the advice names the port asked for")
		}
		require.NotContains(t, a.body, "OrderPlaced", path+": no row is read")
		require.Empty(t, a.header.Get("X-CSRF-Token"), path+": no CSRF token is handed out")
	}
	tok := r.csrf(t)
	a := hostile(http.MethodPost, "/api/v1/outbox/requeue", `{"ids":["`+ids["d1"]+`"]}`,
		map[string]string{"Content-Type": "application/json", "X-CSRF-Token": tok})
	require.Equal(t, http.StatusMisdirectedRequest, a.code, a.body)
	a = hostile(http.MethodPost, "/console/outbox/requeue", "confirm=yes&id="+ids["d1"]+"&csrf_token="+tok,
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	require.Equal(t, http.StatusMisdirectedRequest, a.code, a.body)
	require.Contains(t, r.get(t, "/api/v1/outbox/rows/"+ids["d1"]).body, `"status": "dead"`, "nothing was requeued")
	require.Contains(t, r.logs.String(), "Host is not loopback")

	// Loopback names are served, with or without a port.
	for _, host := range []string{"localhost", "localhost:9464", "LOCALHOST.:9464", "console.localhost:9464", "127.0.0.1", "127.3.4.5:80", "[::1]:9464", "[::1]"} {
		req, err := http.NewRequest(http.MethodGet, r.srv.URL+"/api/v1/outbox/summary", nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, host)
	}

	// With a token the credentials are the check: any name is served to who has them.
	tr := newRig(t, func(c *console.Config) { c.Auth = console.AuthConfig{Token: token} })
	req, err := http.NewRequest(http.MethodGet, tr.srv.URL+"/api/v1/outbox/summary", nil)
	require.NoError(t, err)
	req.Host = "relay.internal.example:9464"
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestLoopbackHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"localhost": true, "localhost:1": true, "a.b.localhost:9": true, "127.0.0.1:9464": true, "[::1]:1": true, "[::1]": true,
		"": false, ".localhost": false, "localhost.example": false, "evil.example:9477": false, "127.0.0.1.nip.io": false,
		"10.0.0.1:80": false, "[::]:80": false, "[fe80::1%25lo]:80": false, "0.0.0.0": false,
	} {
		require.Equal(t, want, console.LoopbackHost(host), host)
	}
}
