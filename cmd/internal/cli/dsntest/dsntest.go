// Package dsntest generates PostgreSQL connection strings that carry a random secret in every
// place one may be written (a URL's userinfo, its password and sslpassword parameters, the
// key=value form with any spacing around '=' and quoted or escaped values), valid or broken in
// the ways a parser reports, for property tests that a secret never reaches an error or a log.
package dsntest

import (
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
)

// Case is one generated connection string.
type Case struct {
	// DSN is the connection string.
	DSN string
	// Secret is the secret it carries.
	Secret string
	// Forbidden are the strings no output may contain: the secret, as written in DSN and in
	// the escaped forms an error message may quote it in.
	Forbidden []string
}

// secretRunes are the characters a generated secret is made of: letters and digits, and every
// character that needs escaping or quoting in one form or the other.
const secretRunes = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" +
	` '\"@:/?#&=%+;,!$*()[]{}~-_.` + "é\t"

// Secret returns a random secret of 8 to 24 characters that starts with a letter.
func Secret(r *rand.Rand) string {
	runes := []rune(secretRunes)
	var b strings.Builder
	b.WriteRune(runes[r.IntN(52)])
	for n := 7 + r.IntN(17); n > 0; n-- {
		b.WriteRune(runes[r.IntN(len(runes))])
	}
	return b.String()
}

// Gen returns a connection string to host 127.0.0.1 port 1 (nothing listens there) with a
// random secret in a random place, form and spacing, and, on most draws, one setting a parser
// refuses (a bad port or sslmode, a key without '=', an unterminated quote, a malformed URL).
func Gen(r *rand.Rand) Case {
	secret := Secret(r)
	c := Case{Secret: secret}
	if r.IntN(2) == 0 {
		c.DSN, c.Forbidden = genURL(r, secret)
	} else {
		c.DSN, c.Forbidden = genKeywordValue(r, secret)
	}
	c.Forbidden = append(c.Forbidden, secret)
	for _, f := range c.Forbidden {
		if q := strconv.Quote(f); q[1:len(q)-1] != f {
			c.Forbidden = append(c.Forbidden, q[1:len(q)-1])
		}
	}
	return c
}

func genURL(r *rand.Rand, secret string) (string, []string) {
	scheme := []string{"postgres://", "postgresql://"}[r.IntN(2)]
	user := "app"
	params := []string{"connect_timeout=1", "sslmode=disable"}
	var written string
	host := "127.0.0.1:1"
	switch r.IntN(4) {
	case 0: // userinfo, escaped
		written = url.UserPassword(user, secret).String()[len(user)+1:]
		user += ":" + written
	case 1: // userinfo, as typed (often a malformed URL)
		written = secret
		user += ":" + secret
	case 2, 3: // a query parameter, escaped or not
		key := []string{"password", "sslpassword"}[r.IntN(2)]
		written = secret
		if r.IntN(2) == 0 {
			written = url.QueryEscape(secret)
		}
		params = append(params, key+"="+written)
	}
	switch r.IntN(6) {
	case 0:
		host = "127.0.0.1:notaport"
	case 1:
		params = append(params, "sslmode=bogus")
	case 2:
		params = append(params, "connect_timeout=soon")
	case 3:
		host = "[127.0.0.1"
	}
	r.Shuffle(len(params), func(i, j int) { params[i], params[j] = params[j], params[i] })
	return scheme + user + "@" + host + "/app?" + strings.Join(params, "&"), []string{written}
}

func genKeywordValue(r *rand.Rand, secret string) (string, []string) {
	spaces := []string{"", " ", "  ", "\t", " \t "}
	sp := func() string { return spaces[r.IntN(len(spaces))] }
	key := []string{"password", "sslpassword"}[r.IntN(2)]
	var value string
	plain := !strings.ContainsAny(secret, " \t'\\")
	switch {
	case plain && r.IntN(3) == 0:
		value = secret
	case r.IntN(2) == 0: // unquoted, every space, quote and backslash escaped
		value = strings.NewReplacer(`\`, `\\`, " ", `\ `, "\t", "\\\t", "'", `\'`).Replace(secret)
		if strings.HasPrefix(value, "'") {
			value = `\` + value
		}
	default: // quoted
		value = "'" + strings.NewReplacer(`\`, `\\`, "'", `\'`).Replace(secret) + "'"
	}
	pairs := []string{"host=127.0.0.1", "port=1", "user=app", "dbname=app", "connect_timeout=1", "sslmode=disable",
		key + sp() + "=" + sp() + value}
	switch r.IntN(6) {
	case 0:
		pairs = append(pairs, "port=notaport")
	case 1:
		pairs = append(pairs, "sslmode=bogus")
	case 2:
		pairs = append(pairs, "dbname")
	case 3:
		pairs = append(pairs, "application_name='unterminated")
	}
	r.Shuffle(len(pairs), func(i, j int) { pairs[i], pairs[j] = pairs[j], pairs[i] })
	sep := func() string { return []string{" ", "  ", "\t", " \n "}[r.IntN(4)] }
	var b strings.Builder
	b.WriteString(sp())
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(sep())
		}
		b.WriteString(p)
	}
	return b.String(), []string{value, strings.Trim(value, "'")}
}
