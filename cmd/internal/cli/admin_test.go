package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

func TestAdminFlagsToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("token", "abc123\n")
	for name, tc := range map[string]struct {
		f       cli.AdminFlags
		want    string
		problem string
	}{
		"none":        {f: cli.AdminFlags{}, want: ""},
		"flag":        {f: cli.AdminFlags{AdminToken: " abc "}, want: "abc"},
		"file":        {f: cli.AdminFlags{AdminTokenFile: good}, want: "abc123"},
		"both":        {f: cli.AdminFlags{AdminToken: "x", AdminTokenFile: good}, problem: "not both"},
		"missing":     {f: cli.AdminFlags{AdminTokenFile: filepath.Join(dir, "nope")}, problem: "read the admin token file"},
		"empty file":  {f: cli.AdminFlags{AdminTokenFile: write("empty", "\n")}, problem: "is empty"},
		"spaced file": {f: cli.AdminFlags{AdminTokenFile: write("spaced", "a b\n")}, problem: "white space"},
	} {
		err := tc.f.ValidateFlags()
		if tc.problem != "" {
			if err == nil || !strings.Contains(err.Error(), tc.problem) {
				t.Fatalf("%s: want a problem %q, got %v", name, tc.problem, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := tc.f.Token()
		if err != nil || got != tc.want {
			t.Fatalf("%s: token %q, %v; want %q", name, got, err, tc.want)
		}
	}
}
