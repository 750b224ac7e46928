package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"unicode"
)

// csrfHeader carries the CSRF token of an API request (and of every GET answer, for clients).
const csrfHeader = "X-CSRF-Token"

// csrfField is the CSRF token's form field in the console's forms.
const csrfField = "csrf_token"

// principal is who made a request: "token" (bearer), the basic-auth user, or
// "anonymous" (loopback without a token).
type principal struct {
	name string
	// bearer is set when the request carried Authorization: Bearer (not sent by browsers on
	// their own, so such a request cannot be forged by another site).
	bearer bool
}

type principalKey struct{}

func principalOf(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

// guard holds the console's secrets.
type guard struct {
	token     []byte // sha256 of the token, nil when none
	allowAnon bool
	csrfKey   []byte
}

func newGuard(a AuthConfig) *guard {
	g := &guard{allowAnon: a.AllowUnauthenticated}
	if a.Token != "" {
		sum := sha256.Sum256([]byte(a.Token))
		g.token = sum[:]
		// Instances sharing a token accept each other's forms (behind a load balancer).
		mac := hmac.New(sha256.New, []byte(a.Token))
		mac.Write([]byte("keiro-console-csrf-key"))
		g.csrfKey = mac.Sum(nil)
	} else {
		g.csrfKey = make([]byte, 32)
		_, _ = rand.Read(g.csrfKey)
	}
	return g
}

func (g *guard) tokenOK(t string) bool {
	sum := sha256.Sum256([]byte(t))
	return subtle.ConstantTimeCompare(sum[:], g.token) == 1
}

// authenticate returns who made r, or an HTTP status and message refusing it.
func (g *guard) authenticate(r *http.Request) (principal, int, string) {
	if g.token == nil {
		if g.allowAnon {
			return principal{name: "anonymous"}, 0, ""
		}
		return principal{}, http.StatusForbidden, "the admin API and console are disabled: the server is not bound to loopback " +
			"and no admin token is set; set --admin-token (or its environment variable or file)"
	}
	h := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(h, "Bearer "); ok && g.tokenOK(strings.TrimSpace(t)) {
		return principal{name: "token", bearer: true}, 0, ""
	}
	if user, pass, ok := r.BasicAuth(); ok && g.tokenOK(pass) {
		return principal{name: cleanName(user)}, 0, ""
	}
	if h == "" {
		return principal{}, http.StatusUnauthorized, "credentials required: send Authorization: Bearer <admin token>, or basic auth with the admin token as password"
	}
	return principal{}, http.StatusUnauthorized, "wrong credentials: the admin token does not match"
}

// openOnLoopback reports whether the guard serves requests without credentials: no token, and
// unauthenticated access allowed (the sidecars allow it only when bound to loopback).
func (g *guard) openOnLoopback() bool { return g.token == nil && g.allowAnon }

// checkHost refuses, when the console serves without credentials, a request whose Host does not
// name loopback. A page of another site can make the browser send requests to the console's
// port under the site's own name (DNS rebinding: evil.example resolved to 127.0.0.1), and the
// browser then treats the console as that site's origin; the Host header still carries the
// site's name, so it is checked before anything is served. With a token the credentials are
// the check, and any Host is served.
func (g *guard) checkHost(r *http.Request) string {
	if !g.openOnLoopback() || loopbackHost(r.Host) {
		return ""
	}
	host := r.Host
	if host == "" {
		host = "(none)"
	}
	return fmt.Sprintf("this console serves without credentials on loopback only, and the Host header %q does not name loopback: "+
		"open it as http://127.0.0.1:PORT/console/ or http://localhost:PORT/console/, or set an admin token "+
		"(--admin-token) to serve it under other names", cleanHost(host))
}

// loopbackHost reports whether a Host header names loopback: "localhost" or a name under
// ".localhost" (RFC 6761 reserves them for loopback and no one can delegate them in DNS),
// an IPv4 literal in 127.0.0.0/8 or the IPv6 literal [::1], with or without a port.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || (strings.HasSuffix(host, ".localhost") && len(host) > len(".localhost")) {
		return true
	}
	if strings.Contains(host, "%") {
		return false // a zoned IPv6 address is never loopback
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// cleanHost makes a Host header safe to quote in a message (printable, short).
func cleanHost(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, s)
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return s
}

// cleanName makes a basic-auth user name safe to log (printable, short); empty becomes "basic".
func cleanName(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) && r != ' ' {
			return r
		}
		return -1
	}, s)
	if len(s) > 64 {
		s = s[:64]
	}
	if s == "" {
		return "basic"
	}
	return "basic:" + s
}

// csrfToken is the token of p's forms: an HMAC of who p is, so it is valid for p only.
func (g *guard) csrfToken(p principal) string {
	mac := hmac.New(sha256.New, g.csrfKey)
	mac.Write([]byte(p.name))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func (g *guard) csrfOK(p principal, t string) bool {
	return t != "" && hmac.Equal([]byte(g.csrfToken(p)), []byte(t))
}

// sameOrigin checks Origin, else Referer, against the request's host. It reports whether a
// header was present at all and whether the present one matched.
func sameOrigin(r *http.Request) (present, ok bool) {
	ref := r.Header.Get("Origin")
	if ref == "" || ref == "null" {
		if ref == "null" {
			return true, false
		}
		ref = r.Header.Get("Referer")
	}
	if ref == "" {
		return false, false
	}
	u, err := url.Parse(ref)
	if err != nil || u.Host == "" {
		return true, false
	}
	return true, strings.EqualFold(u.Host, r.Host)
}

// checkForm is the CSRF check of a console form POST: same origin, and the form's token.
func (g *guard) checkForm(r *http.Request, p principal) string {
	present, ok := sameOrigin(r)
	switch {
	case !present:
		return "cross-site request refused: the form post carried neither Origin nor Referer"
	case !ok:
		return "cross-site request refused: Origin or Referer is not this console's host"
	case !g.csrfOK(p, r.PostFormValue(csrfField)):
		return "cross-site request refused: missing or stale form token; reload the page and try again"
	}
	return ""
}

// checkAPI is the CSRF check of an API POST: a JSON body (a cross-site form cannot send one
// without a preflight, which is never granted), a same-origin Origin/Referer if a browser sent
// one, and either a bearer token or the X-CSRF-Token of a GET answer.
func (g *guard) checkAPI(r *http.Request, p principal) string {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "application/json" {
		return "send the request body as JSON with Content-Type: application/json"
	}
	if present, ok := sameOrigin(r); present && !ok {
		return "cross-site request refused: Origin or Referer is not this server's host"
	}
	if !p.bearer && !g.csrfOK(p, r.Header.Get(csrfHeader)) {
		return "missing or wrong " + csrfHeader + " header: copy it from the " + csrfHeader +
			" header of any GET answer, or authenticate with Authorization: Bearer"
	}
	return ""
}
