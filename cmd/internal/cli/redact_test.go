package cli_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/cli/dsntest"
)

// Property: for connection strings with a random secret in every place and form pgx reads one
// from, valid or broken, neither RedactDSN nor RedactError of pgx's parse error shows it.
func TestRedactErrorHidesGeneratedSecrets(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for range 3000 {
		c := dsntest.Gen(r)
		texts := map[string]string{"RedactDSN": cli.RedactDSN(c.DSN)}
		if _, err := pgx.ParseConfig(c.DSN); err != nil {
			red := cli.RedactError(err, cli.DSN(c.DSN))
			texts["RedactError"] = red.Error()
			if !errors.Is(red, err) {
				t.Fatalf("RedactError does not unwrap to pgx's error")
			}
		}
		for name, text := range texts {
			for _, f := range c.Forbidden {
				if strings.Contains(text, f) {
					t.Fatalf("%s shows the secret %q (as %q) of\n%q:\n%s", name, c.Secret, f, c.DSN, text)
				}
			}
		}
	}
}

// pgx's own redaction misses a password written with spaces around '='.
func TestRedactErrorPasswordWithSpaces(t *testing.T) {
	for _, dsn := range []string{
		"host=h port=notaport password = s3cret-pw",
		"host=h port=notaport password= 's3 \\'cret-pw'",
		"postgres://u:s3cret-pw@h:notaport/db",
		"postgres://u@h/db?sslmode=bogus&sslpassword=s3cret-pw",
	} {
		_, err := pgx.ParseConfig(dsn)
		if err == nil {
			t.Fatalf("%q parsed", dsn)
		}
		if got := cli.RedactError(err, cli.DSN(dsn)).Error(); strings.Contains(got, "s3cret") || strings.Contains(got, "cret-pw") {
			t.Errorf("RedactError(%q) = %s", dsn, got)
		}
	}
}
