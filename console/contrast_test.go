package console_test

import (
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// cssBlock is a rule of a stylesheet: its selector or at-rule prelude and its body.
type cssBlock struct{ prelude, body string }

// cssBlocks splits a stylesheet (comments removed) into its top-level blocks.
func cssBlocks(s string) []cssBlock {
	var out []cssBlock
	depth, start, open := 0, 0, 0
	for i, c := range s {
		switch c {
		case '{':
			if depth == 0 {
				open = i
			}
			depth++
		case '}':
			depth--
			if depth == 0 {
				out = append(out, cssBlock{prelude: strings.TrimSpace(s[start:open]), body: s[open+1 : i]})
				start = i + 1
			}
		}
	}
	return out
}

// declarations reads a rule body's property: value pairs.
func declarations(body string) map[string]string {
	out := map[string]string{}
	for d := range strings.SplitSeq(body, ";") {
		if k, v, ok := strings.Cut(d, ":"); ok {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}

// theme is the custom properties of one colour scheme.
type theme struct {
	name string
	vars map[string]string
}

var hexColour = regexp.MustCompile(`^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$`)

// resolve turns a colour value (#hex or var(--x)) into a hex colour; ok is false for anything else.
func (t theme) resolve(v string) (string, bool) {
	for range 5 {
		if name, ok := strings.CutPrefix(v, "var("); ok {
			v = t.vars[strings.TrimSuffix(name, ")")]
			continue
		}
		break
	}
	if hexColour.MatchString(v) {
		return v, true
	}
	return "", false
}

// luminance is WCAG 2's relative luminance of a #rgb or #rrggbb colour.
func luminance(hex string) float64 {
	h := strings.TrimPrefix(hex, "#")
	if len(h) == 3 {
		h = string([]byte{h[0], h[0], h[1], h[1], h[2], h[2]})
	}
	var ch [3]float64
	for i := range ch {
		n, _ := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		c := float64(n) / 255
		if c <= 0.03928 {
			ch[i] = c / 12.92
		} else {
			ch[i] = math.Pow((c+0.055)/1.055, 2.4)
		}
	}
	return 0.2126*ch[0] + 0.7152*ch[1] + 0.0722*ch[2]
}

// contrast is WCAG 2's contrast ratio of two colours.
func contrast(a, b string) float64 {
	la, lb := luminance(a), luminance(b)
	return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)
}

// themes reads the light :root and the dark one of prefers-color-scheme from the stylesheet.
func themes(t *testing.T, blocks []cssBlock) []theme {
	t.Helper()
	light, dark := theme{name: "light", vars: map[string]string{}}, theme{name: "dark", vars: map[string]string{}}
	for _, b := range blocks {
		switch {
		case b.prelude == ":root":
			for k, v := range declarations(b.body) {
				light.vars[k] = v
			}
		case strings.Contains(b.prelude, "prefers-color-scheme: dark"):
			for _, inner := range cssBlocks(b.body) {
				if inner.prelude == ":root" {
					for k, v := range declarations(inner.body) {
						dark.vars[k] = v
					}
				}
			}
		}
	}
	require.NotEmpty(t, light.vars, "the stylesheet's :root")
	require.NotEmpty(t, dark.vars, "the stylesheet's dark theme (prefers-color-scheme: dark)")
	for k := range light.vars {
		if strings.HasPrefix(k, "--") && k != "--mono" {
			require.Contains(t, dark.vars, k, "the dark theme sets every colour of the light one")
		}
	}
	return []theme{light, dark}
}

// TestContrast: every text colour of the stylesheet meets WCAG AA (4.5:1) on the surfaces it is
// used on, in the light and the dark theme: the pairs below (text on the page's surfaces), and
// every rule that sets both a colour and a background.
func TestContrast(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("assets/console.css")
	require.NoError(t, err)
	css := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(string(raw), "")
	blocks := cssBlocks(css)
	// Text colours on the surfaces they appear on without a rule of their own.
	pairs := [][2]string{
		{"--ink", "--bg"}, {"--ink", "--panel"}, {"--ink", "--head"}, {"--ink", "--row-hover"}, {"--ink", "--field-bg"},
		{"--muted", "--bg"}, {"--muted", "--panel"}, {"--muted", "--head"}, {"--muted", "--row-hover"},
		{"--accent", "--bg"}, {"--accent", "--panel"}, {"--accent", "--head"}, {"--accent", "--row-hover"},
		{"--bad", "--panel"}, {"--bad", "--bad-soft"}, {"--warn", "--panel"}, {"--warn", "--warn-soft"}, {"--ok", "--ok-soft"},
		{"--reason", "--panel"}, {"--ink", "--bad-soft"}, {"--ink", "--warn-soft"}, {"--accent", "--warn-soft"}, {"--accent", "--bad-soft"},
		{"--top-ink", "--top-bg"}, {"--top-muted", "--top-bg"}, {"--top-ink", "--top-on"}, {"--top-ink", "--top-hover"}, {"--top-muted", "--top-hover"},
		{"--ro-ink", "--ro-bg"}, {"--payload-ink", "--payload-bg"}, {"--badge-ink", "--badge"}, {"--accent-ink", "--accent"},
	}
	checked := 0
	for _, th := range themes(t, blocks) {
		for _, p := range pairs {
			fg, ok1 := th.resolve("var(" + p[0] + ")")
			bg, ok2 := th.resolve("var(" + p[1] + ")")
			require.True(t, ok1 && ok2, "%s theme: %s on %s are colours", th.name, p[0], p[1])
			r := contrast(fg, bg)
			require.GreaterOrEqual(t, r, 4.5, "%s theme: %s (%s) on %s (%s) is %.2f:1", th.name, p[0], fg, p[1], bg, r)
			checked++
		}
		var rules []cssBlock
		for _, b := range blocks {
			if strings.HasPrefix(b.prelude, "@media") {
				rules = append(rules, cssBlocks(b.body)...)
			} else {
				rules = append(rules, b)
			}
		}
		for _, b := range rules {
			d := declarations(b.body)
			bgv := d["background"]
			if bgv == "" {
				bgv = d["background-color"]
			}
			fg, ok1 := th.resolve(d["color"])
			bg, ok2 := th.resolve(bgv)
			if !ok1 || !ok2 {
				continue
			}
			r := contrast(fg, bg)
			require.GreaterOrEqual(t, r, 4.5, "%s theme: %q sets %s on %s: %.2f:1", th.name, b.prelude, fg, bg, r)
			checked++
		}
	}
	require.Greater(t, checked, 2*len(pairs), "rules with a colour and a background were checked")
	t.Logf("%d colour pairs checked", checked)
}

func TestContrastRatio(t *testing.T) {
	t.Parallel()
	require.InDelta(t, 21, contrast("#000", "#ffffff"), 0.01)
	require.InDelta(t, 1, contrast("#777777", "#777"), 0.001)
	require.InDelta(t, 4.48, contrast("#777777", "#ffffff"), 0.01, "the classic just-failing grey")
}
