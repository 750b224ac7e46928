package console

import (
	"net"
	"net/http"
	"strings"
)

// errorData is the error page's content: what went wrong, and what to do about it given how
// this console was started (token or loopback, read-only, which parts it serves).
type errorData struct {
	Status  int
	Message string
	Advice  []string
	Links   []link
}

// link is a link of the error page.
type link struct{ Href, Text string }

func (c *Console) pageError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if c.pages == nil {
		http.Error(w, msg, status)
		return
	}
	d := errorData{Status: status, Message: msg, Advice: c.advice(r, status, msg), Links: c.errorLinks(status)}
	c.render(w, r, status, "error", http.StatusText(status), "", d)
}

// advice is what an operator can do about an error, in the terms of how the console runs.
func (c *Console) advice(r *http.Request, status int, msg string) []string {
	g := c.guard
	switch status {
	case http.StatusMisdirectedRequest:
		port := "PORT"
		if _, p, err := net.SplitHostPort(r.Host); err == nil && p != "" {
			port = p
		}
		return []string{
			"Open the console at http://127.0.0.1:" + port + "/console/ or http://localhost:" + port + "/console/.",
			"This console runs without an admin token, so it answers loopback names only: a page of another site cannot reach it under its own name.",
			"To open it under another name (a port forward, a proxy), start the relay or consumer with --admin-token (or --admin-token-file).",
		}
	case http.StatusUnauthorized:
		return []string{
			"Sign in with the admin token as the password (any user name: it is logged as who acted), or send Authorization: Bearer TOKEN.",
			"The token is the relay's or consumer's --admin-token (its environment variable, or the file of --admin-token-file).",
		}
	case http.StatusForbidden:
		switch {
		case c.cfg.ReadOnly:
			return []string{
				"This console was started read-only (--admin-read-only): it shows everything and changes nothing.",
				"To act, restart it without --admin-read-only, or use the command line: relay dead requeue, consumer inbox failed retry.",
			}
		case g.token == nil && !g.allowAnon:
			return []string{
				"This server listens beyond loopback and has no admin token, so the console and the admin API are off.",
				"Set --admin-token (or --admin-token-file), or bind --http-addr to 127.0.0.1.",
			}
		case strings.Contains(msg, "form token"):
			return []string{"Go back, reload the page with the form, and submit it again: a form outlives neither a restart of a console without a token nor a change of token."}
		case strings.HasPrefix(msg, "cross-site"):
			return []string{"Submit the form from the console's own pages: actions are accepted only from the console's origin."}
		}
	case http.StatusNotFound:
		if strings.Contains(msg, "not configured") {
			return []string{"The relay serves the outbox and the subscriptions; the consumer serves the inbox. Open the console of the process that owns what you look for."}
		}
		return []string{"Check the address, or start from one of the pages below. Rows deleted by retention are gone for good."}
	case http.StatusBadRequest:
		return []string{"Start again from the list: the page's links and forms send what it expects."}
	case http.StatusNotImplemented:
		return []string{"Retry runs the consumer's handler: it is offered by the consumer's own console (or one embedded with InboxConfig.Handler)."}
	case http.StatusInternalServerError, http.StatusBadGateway:
		return []string{
			"The database or Kafka may be unreachable: /readyz says which, and the process's log has this error with the request's path.",
			"Reload once it is back; nothing was changed by a request that failed this way unless its result page said so.",
		}
	}
	return nil
}

// errorLinks are the pages an error page offers: the overview and the parts served here.
func (c *Console) errorLinks(status int) []link {
	if status == http.StatusMisdirectedRequest || status == http.StatusUnauthorized ||
		(status == http.StatusForbidden && c.guard.token == nil && !c.guard.allowAnon) {
		return nil // nothing here is served to this request
	}
	out := []link{{"/console/", "Overview"}}
	if c.cfg.Outbox != nil {
		out = append(out, link{"/console/outbox", "Outbox"})
	}
	if c.cfg.Inbox != nil {
		out = append(out, link{"/console/inbox", "Inbox"})
	}
	if c.cfg.Outbox != nil || c.cfg.Inbox != nil {
		out = append(out, link{"/console/search", "Find a message"})
	}
	return out
}
