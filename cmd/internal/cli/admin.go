package cli

import (
	"fmt"
	"os"
	"strings"
)

// AdminFlags configure the admin API and the operator console served on the HTTP address.
// Embed them in a command (`embed:""`); their environment variables follow the App's prefix
// (KEIRO_RELAY_ADMIN_TOKEN, KEIRO_RELAY_ADMIN_READ_ONLY). KEIRO_RELAY_ADMIN_TOKEN_FILE names a
// file holding the token, as for every secret flag; --admin-token-file is its command-line form
// and has no variable of its own, so the two cannot disagree.
type AdminFlags struct {
	AdminToken     Secret `name:"admin-token" help:"Bearer token (or basic-auth password) of the admin API and console under /api/v1/ and /console/. Required when --http-addr is not loopback; never printed." placeholder:"TOKEN"`
	AdminTokenFile string `name:"admin-token-file" env:"-" help:"File holding the admin token (trailing newline trimmed), instead of --admin-token." placeholder:"FILE"`
	AdminReadOnly  bool   `name:"admin-read-only" help:"Serve the admin API and console read-only: no requeue or retry."`
}

// ValidateFlags reports a token given twice and an unreadable token file.
func (f *AdminFlags) ValidateFlags() error {
	var p Problems
	if f.AdminToken != "" && f.AdminTokenFile != "" {
		p.Add("admin-token-file", "give either --admin-token or --admin-token-file, not both")
	}
	if _, err := f.Token(); err != nil {
		p.AddErr("admin-token-file", err)
	}
	return p.Err()
}

// Token returns the admin token: --admin-token, else the content of --admin-token-file (its
// trailing white space trimmed), else "".
func (f *AdminFlags) Token() (string, error) {
	if f.AdminTokenFile == "" {
		return strings.TrimSpace(f.AdminToken.Reveal()), nil
	}
	b, err := os.ReadFile(f.AdminTokenFile)
	if err != nil {
		return "", fmt.Errorf("read the admin token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("the admin token file %s is empty", f.AdminTokenFile)
	}
	if strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("the admin token in %s contains white space; write the token alone", f.AdminTokenFile)
	}
	return t, nil
}
