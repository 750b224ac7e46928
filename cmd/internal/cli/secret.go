package cli

import (
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"

	"github.com/alecthomas/kong"
)

// Redacted is what a secret prints as.
const Redacted = "******"

// Secret is a string that never prints: String, GoString, Format verbs through String,
// slog (LogValue) and text/JSON marshalling all yield [Redacted]. Use [Secret.Reveal] where the
// value itself is needed (to authenticate). An empty Secret prints as "".
type Secret string

// Reveal returns the secret value.
func (s Secret) Reveal() string { return string(s) }

// String returns [Redacted], or "" for an empty secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return Redacted
}

// GoString returns the same as String, so %#v does not leak the value either.
func (s Secret) GoString() string { return `"` + s.String() + `"` }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText implements encoding.TextMarshaler with the redacted form.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// DSN is a PostgreSQL connection string (a postgres:// URL or a key=value list) whose password
// is redacted whenever it is printed or logged. Use [DSN.Reveal] to connect.
type DSN string

// Reveal returns the connection string with its password.
func (d DSN) Reveal() string { return string(d) }

// String returns the connection string with any password replaced by [Redacted].
func (d DSN) String() string { return RedactDSN(string(d)) }

// GoString returns the same as String, quoted.
func (d DSN) GoString() string { return `"` + d.String() + `"` }

// LogValue implements slog.LogValuer.
func (d DSN) LogValue() slog.Value { return slog.StringValue(d.String()) }

// MarshalText implements encoding.TextMarshaler with the redacted form.
func (d DSN) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// secretFiles resolves every Secret and DSN flag that is not on the command line from the file
// named by its environment variable with _FILE appended (KEIRO_RELAY_DATABASE_URL_FILE), the
// convention of container secrets mounted as files. The file's trailing line break is dropped.
// Setting both the variable and its _FILE form is an error.
var secretFiles kong.ResolverFunc = func(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
	switch flag.Target.Type() {
	case reflect.TypeFor[Secret](), reflect.TypeFor[DSN]():
	default:
		return nil, nil
	}
	for _, env := range flag.Envs {
		path, ok := os.LookupEnv(env + "_FILE")
		if !ok {
			continue
		}
		if _, both := os.LookupEnv(env); both {
			return nil, fmt.Errorf("set $%s or $%s_FILE, not both", env, env)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read $%s_FILE: %w", env, err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	return nil, nil
}
