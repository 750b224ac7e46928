package cli

import (
	"errors"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// RedactDSN replaces the secrets of a connection string with [Redacted]: in URL form (any
// scheme: postgres, kafka, http) the password of the user:password@ part and the value of every
// query parameter that names a secret (password, sslpassword, token, secret, api_key, sig, …);
// in PostgreSQL's key=value form the value of every key that names a secret, with any spaces
// around '=' and quoted values ('s3 cret', with \' and \\ escapes). A URL that does not parse has
// everything between "://" and its last '@' redacted; a key=value string that breaks off after
// a secret's key has the rest redacted, so that a malformed secret is not printed either.
func RedactDSN(s string) string {
	red, _ := redactDSN(s)
	return red
}

// RedactError returns err with the secrets of the connection string dsn removed from its text,
// for every error that may quote it (pgx's parse errors quote the string, with a redaction of
// their own that misses `password = s3cret` written with spaces; a URL parser's errors quote
// it whole). Every occurrence of dsn becomes [RedactDSN] of it, and every secret value dsn holds
// (as written and unescaped) becomes [Redacted]. The result unwraps to err; it is err itself
// when there is nothing to remove.
func RedactError(err error, dsn DSN) error {
	if err == nil || dsn == "" {
		return err
	}
	msg := err.Error()
	red := RedactText(msg, dsn)
	// pgx's ParseConfigError quotes its own redaction of the string it could not parse (dsn, or
	// a string derived from it): quote ours instead.
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) && pce.ConnString != "" {
		theirs := pce.Error()
		prefix := pgconn.NewParseConfigError(pce.ConnString, "", nil).Error() // "cannot parse `…`: "
		if rest, ok := strings.CutPrefix(theirs, prefix); ok {
			ours := "cannot parse `" + RedactDSN(pce.ConnString) + "`: " + rest
			red = RedactText(strings.ReplaceAll(msg, theirs, ours), dsn)
			if pce.ConnString != dsn.Reveal() {
				red = RedactText(red, DSN(pce.ConnString))
			}
		}
	}
	if red == msg {
		return err
	}
	return &redactedError{msg: red, err: err}
}

// RedactText is [RedactError] for a text (a log line): every occurrence of dsn becomes
// [RedactDSN] of it and every secret value dsn holds becomes [Redacted].
func RedactText(text string, dsn DSN) string {
	raw := dsn.Reveal()
	if raw == "" || text == "" {
		return text
	}
	redacted, secrets := redactDSN(raw)
	if redacted != raw {
		text = strings.ReplaceAll(text, raw, redacted)
		if q, qr := strconv.Quote(raw), strconv.Quote(redacted); q != `"`+raw+`"` {
			text = strings.ReplaceAll(text, q[1:len(q)-1], qr[1:len(qr)-1])
		}
	}
	for _, s := range secrets {
		if s != "" && s != Redacted {
			text = strings.ReplaceAll(text, s, Redacted)
		}
	}
	return text
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// secretKey reports whether a URL query parameter or a key=value keyword names a secret.
func secretKey(k string) bool {
	k = strings.ToLower(strings.NewReplacer("_", "", "-", "", ".", "").Replace(k))
	switch k {
	case "pwd", "pass", "sig", "signature", "auth", "authorization", "key", "sslkey":
		return true
	}
	for _, w := range []string{"password", "passwd", "secret", "token", "apikey", "accesskey", "credential", "privatekey"} {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// redactDSN returns s redacted and the secret values it found, longest first, each as written
// and, when it differs, unescaped.
func redactDSN(s string) (string, []string) {
	if s == "" {
		return "", nil
	}
	var red string
	var secrets []string
	if i := strings.Index(s, "://"); i > 0 && isScheme(s[:i]) {
		red, secrets = redactURL(s, i)
	} else {
		red, secrets = redactKeywordValue(s)
	}
	// As an error may quote them (%q).
	for _, v := range secrets {
		if q := strconv.Quote(v); q[1:len(q)-1] != v {
			secrets = append(secrets, q[1:len(q)-1])
		}
	}
	// Longest first, so that a secret containing another is replaced whole.
	for i := 1; i < len(secrets); i++ {
		for j := i; j > 0 && len(secrets[j]) > len(secrets[j-1]); j-- {
			secrets[j], secrets[j-1] = secrets[j-1], secrets[j]
		}
	}
	return red, secrets
}

// redactURL redacts a URL whose scheme ends at i ("://").
func redactURL(s string, i int) (string, []string) {
	var secrets []string
	add := func(raw string) {
		if raw == "" {
			return
		}
		secrets = append(secrets, raw)
		if dec, err := url.PathUnescape(raw); err == nil && dec != raw {
			secrets = append(secrets, dec)
		}
		if dec, err := url.QueryUnescape(raw); err == nil && dec != raw {
			secrets = append(secrets, dec)
		}
	}
	u, err := url.Parse(s)
	if err != nil || (u.User == nil && strings.Contains(s[i+3:], "@")) || strings.Contains(u.Host+u.Path, "@") {
		// Unclear boundaries: the userinfo is everything up to the last '@' (over-redacting a
		// user name or a query value rather than printing a password), the query what follows
		// the first '?' after it.
		rest := s[i+3:]
		head := s[:i+3]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			userinfo := rest[:at]
			if c := strings.Index(userinfo, ":"); c >= 0 {
				add(userinfo[c+1:])
			} else {
				add(userinfo)
			}
			head += Redacted + "@"
			rest = rest[at+1:]
		}
		if q := strings.Index(rest, "?"); q >= 0 {
			query, qs := redactQuery(rest[q+1:])
			for _, v := range qs {
				add(v)
			}
			rest = rest[:q+1] + query
		}
		return head + rest, secrets
	}
	out := s
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			// The password as written: between the first ':' of the userinfo and its '@'.
			rawUser := s[i+3:]
			if end := strings.IndexAny(rawUser, "/?#"); end >= 0 {
				rawUser = rawUser[:end]
			}
			if at := strings.LastIndex(rawUser, "@"); at >= 0 {
				if c := strings.Index(rawUser[:at], ":"); c >= 0 {
					add(rawUser[c+1 : at])
					out = s[:i+3] + rawUser[:c+1] + Redacted + s[i+3+at:]
				}
			}
			add(pw)
		}
	}
	if q := strings.Index(out, "?"); q >= 0 && u.RawQuery != "" {
		tail := out[q+1:]
		frag := ""
		if h := strings.Index(tail, "#"); h >= 0 {
			tail, frag = tail[:h], tail[h:]
		}
		query, qs := redactQuery(tail)
		for _, v := range qs {
			add(v)
		}
		out = out[:q+1] + query + frag
	}
	return out, secrets
}

// redactQuery redacts the values of a raw query string's secret parameters, keeping the rest
// as written.
func redactQuery(q string) (string, []string) {
	var secrets []string
	parts := strings.Split(q, "&")
	for n, p := range parts {
		k, v, ok := strings.Cut(p, "=")
		dk, err := url.QueryUnescape(k)
		if err != nil {
			dk = k
		}
		if ok && v != "" && secretKey(dk) {
			secrets = append(secrets, v)
			parts[n] = k + "=" + Redacted
		}
	}
	return strings.Join(parts, "&"), secrets
}

// redactKeywordValue redacts PostgreSQL's key=value form as libpq reads it: a keyword, optional
// spaces, '=', optional spaces, then a value that is either quoted ('…' with \' and \\ escapes)
// or runs to the next space (with \ escapes).
func redactKeywordValue(s string) (string, []string) {
	var out strings.Builder
	var secrets []string
	i := 0
	for i < len(s) {
		// Spaces between pairs.
		j := i
		for j < len(s) && isSpace(s[j]) {
			j++
		}
		out.WriteString(s[i:j])
		i = j
		if i == len(s) {
			break
		}
		// Keyword.
		for j < len(s) && !isSpace(s[j]) && s[j] != '=' {
			j++
		}
		key := s[i:j]
		secret := secretKey(key)
		out.WriteString(key)
		i = j
		for j < len(s) && isSpace(s[j]) {
			j++
		}
		if j == len(s) || s[j] != '=' {
			// Malformed: no '=' after the keyword. Whatever follows a secret's keyword may
			// be its value.
			if secret && i < len(s) {
				secrets = append(secrets, strings.TrimSpace(s[i:]))
				out.WriteString(s[i:j])
				if j < len(s) {
					out.WriteString(Redacted)
				}
				return out.String(), secrets
			}
			out.WriteString(s[i:j])
			i = j
			continue
		}
		j++ // '='
		for j < len(s) && isSpace(s[j]) {
			j++
		}
		out.WriteString(s[i:j])
		// Value.
		raw, val, closed, end := readValue(s, j)
		if !closed {
			// An unterminated quote runs to the end: what it swallowed may be a secret's pair.
			secrets = append(secrets, raw[1:], val)
			out.WriteString(Redacted)
			return strayKeywordValues(s, out.String(), secrets)
		}
		if secret && raw != "" {
			secrets = append(secrets, strings.TrimSuffix(strings.TrimPrefix(raw, "'"), "'"), raw, val)
			out.WriteString(Redacted)
		} else {
			out.WriteString(raw)
		}
		i = end
	}
	return strayKeywordValues(s, out.String(), secrets)
}

// readValue reads the value that starts at s[j]: quoted ('…' with \ escapes, closed false when
// the quote is not) or up to the next space (with \ escapes). It returns the value as written,
// unescaped, and the index after it.
func readValue(s string, j int) (raw, val string, closed bool, end int) {
	i := j
	var b strings.Builder
	if j < len(s) && s[j] == '\'' {
		j++
		for j < len(s) {
			c := s[j]
			if c == '\\' && j+1 < len(s) {
				b.WriteByte(s[j+1])
				j += 2
				continue
			}
			j++
			if c == '\'' {
				return s[i:j], b.String(), true, j
			}
			b.WriteByte(c)
		}
		return s[i:j], b.String(), false, j
	}
	for j < len(s) && !isSpace(s[j]) {
		if s[j] == '\\' && j+1 < len(s) {
			b.WriteByte(s[j+1])
			j += 2
			continue
		}
		b.WriteByte(s[j])
		j++
	}
	return s[i:j], b.String(), true, j
}

// strayKeywordValues redacts in out, and adds to secrets, the value after every secret's
// keyword and '=' in s that the tokenizer did not read as a pair (a quote left open or closed
// early makes a password's pair part of another value).
func strayKeywordValues(s, out string, secrets []string) (string, []string) {
	for i := 0; i < len(s); i++ {
		if s[i] != '=' {
			continue
		}
		k := i
		for k > 0 && isSpace(s[k-1]) {
			k--
		}
		start := k
		for start > 0 && !isSpace(s[start-1]) && s[start-1] != '=' && s[start-1] != '\'' {
			start--
		}
		if !secretKey(s[start:k]) {
			continue
		}
		j := i + 1
		for j < len(s) && isSpace(s[j]) {
			j++
		}
		raw, val, _, _ := readValue(s, j)
		for _, v := range []string{raw, strings.Trim(raw, "'"), val} {
			if v != "" && v != Redacted {
				secrets = append(secrets, v)
				out = strings.ReplaceAll(out, v, Redacted)
			}
		}
	}
	return out, secrets
}

// isScheme reports whether s is a URL scheme: a letter, then letters, digits, '+', '-', '.'.
func isScheme(s string) bool {
	for i := range len(s) {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

func isSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}
