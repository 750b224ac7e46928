package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every Secret and DSN flag reads $<VAR>_FILE; the command line still wins, and setting both
// the variable and its _FILE form is an error. (Not parallel: it sets the environment.)
func TestSecretsFromFiles(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	dsn := filepath.Join(dir, "dsn")
	if err := os.WriteFile(pw, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dsn, []byte("postgres://u:filepass@h/db\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KEIRO_T_PASSWORD_FILE", pw)
	t.Setenv("KEIRO_T_DATABASE_URL_FILE", dsn)
	var out bytes.Buffer
	g := &testGrammar{}
	if _, err := app(&out).Parse(g, []string{"run"}); err != nil {
		t.Fatal(err)
	}
	if g.Group.Password.Reveal() != "from-file" || g.DatabaseURL.Reveal() != "postgres://u:filepass@h/db" {
		t.Fatalf("from files: %q %q", g.Group.Password.Reveal(), g.DatabaseURL.Reveal())
	}

	g = &testGrammar{}
	if _, err := app(&out).Parse(g, []string{"run", "--password=flag"}); err != nil || g.Group.Password.Reveal() != "flag" {
		t.Fatalf("the command line must win: %q %v", g.Group.Password.Reveal(), err)
	}

	t.Setenv("KEIRO_T_PASSWORD", "env")
	_, err := app(&out).Parse(&testGrammar{}, []string{"run"})
	if err == nil || !strings.Contains(err.Error(), "set $KEIRO_T_PASSWORD or $KEIRO_T_PASSWORD_FILE, not both") {
		t.Fatalf("both set: %v", err)
	}
	os.Unsetenv("KEIRO_T_PASSWORD")
	t.Setenv("KEIRO_T_PASSWORD_FILE", filepath.Join(dir, "missing"))
	_, err = app(&out).Parse(&testGrammar{}, []string{"run"})
	if err == nil || !strings.Contains(err.Error(), "read $KEIRO_T_PASSWORD_FILE") || strings.Contains(err.Error(), "filepass") {
		t.Fatalf("missing file: %v", err)
	}
}
