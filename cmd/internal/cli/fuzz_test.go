package cli_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

// FuzzParse feeds arbitrary command lines (outside input) to the parser: it must never panic,
// and a failure must be an error whose every problem names something ("--flag: …" or kong's
// own message), never an empty one.
func FuzzParse(f *testing.F) {
	f.Add("--batch-size=3\x00run")
	f.Add("other\x00--limit=1000\x00--fail")
	f.Add("--lease=1h\x00--log-level=debug\x00--password=x")
	f.Add("--help")
	f.Add("--batch-size\x00--lease")
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Split(line, "\x00")
		var out bytes.Buffer
		a := cli.App{Name: "t", EnvPrefix: "KEIRO_T", Stdout: &out, Stderr: &out}
		_, err := a.Parse(&testGrammar{}, args)
		if err == nil || errors.Is(err, cli.ErrHelp) {
			return
		}
		problems := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			problems = j.Unwrap()
		}
		for _, p := range problems {
			if strings.TrimSpace(p.Error()) == "" {
				t.Fatalf("empty problem in %q for %q", err, args)
			}
		}
	})
}
