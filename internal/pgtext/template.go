package pgtext

import (
	"fmt"
	"regexp"
	"strings"
)

// placeholder is a template's {{name}}.
var placeholder = regexp.MustCompile(`\{\{[a-z_]+\}\}`)

// Expand is keiro's one SQL template: it fills every {{name}} placeholder of q with the value
// given for name in vars (name, value pairs; values are SQL text the caller has validated:
// identifiers, fixed expressions). It panics on an odd vars or a placeholder left unfilled:
// statements are expanded once, when a store is built, so a template mistake fails every test
// that builds one instead of reaching the database as invalid SQL.
func Expand(q string, vars ...string) string {
	if len(vars)%2 != 0 {
		panic("pgtext.Expand: vars must be name, value pairs")
	}
	pairs := make([]string, 0, len(vars))
	for i := 0; i < len(vars); i += 2 {
		pairs = append(pairs, "{{"+vars[i]+"}}", vars[i+1])
	}
	out := strings.NewReplacer(pairs...).Replace(q)
	if left := placeholder.FindString(out); left != "" {
		panic(fmt.Sprintf("pgtext.Expand: placeholder %s left unfilled in %q", left, firstLine(q)))
	}
	return out
}

// Partial fills the placeholders of q named in vars and leaves the others for a later Expand:
// for a statement assembled in steps.
func Partial(q string, vars ...string) string {
	if len(vars)%2 != 0 {
		panic("pgtext.Partial: vars must be name, value pairs")
	}
	pairs := make([]string, 0, len(vars))
	for i := 0; i < len(vars); i += 2 {
		pairs = append(pairs, "{{"+vars[i]+"}}", vars[i+1])
	}
	return strings.NewReplacer(pairs...).Replace(q)
}

func firstLine(q string) string {
	q = strings.TrimSpace(q)
	if i := strings.IndexByte(q, '\n'); i >= 0 {
		return q[:i] + " …"
	}
	return q
}
