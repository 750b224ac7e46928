package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// ErrHelp is returned by [App.Parse] when --help was asked for and printed.
var ErrHelp = errors.New("help requested")

// ExitUsage is the exit code for command-line and configuration problems; ExitFailure is the
// exit code for a command that failed while running.
const (
	ExitUsage   = 2
	ExitFailure = 1
)

// App describes a binary: its name, what it does and the prefix of its environment variables.
type App struct {
	// Name is the binary's name as typed ("relay"). Required.
	Name string
	// Description is the one-paragraph summary shown by --help. Defaults to none.
	Description string
	// EnvPrefix is prepended to every flag's environment variable: with "KEIRO_RELAY",
	// --batch-size reads KEIRO_RELAY_BATCH_SIZE. A flag may set its own with an env:"…" tag.
	// Required.
	EnvPrefix string
	// Stdout receives help and command output. Defaults to os.Stdout.
	Stdout io.Writer
	// Stderr receives error reports. Defaults to os.Stderr.
	Stderr io.Writer
	// Options are extra kong options (mappers, bindings, vars). Defaults to none.
	Options []kong.Option

	// jsonErrors prints error reports as JSON log lines (set by Run from the grammar's
	// JSONLogs).
	jsonErrors bool
}

// FlagValidator is implemented by grammar structs — the root, a command, or a flag group
// embedded in either — that check their own values. ValidateFlags returns every problem it
// finds, joined, preferably built with [Problems] so that each names its flag. [App.Parse]
// calls it on every struct of the selected command path, nested groups included, and joins
// all the results with the values that did not parse, so the user sees every problem at once.
//
// The method is deliberately not named Validate: kong would call that itself and stop at the
// first failure.
type FlagValidator interface {
	ValidateFlags() error
}

// Env is bound into every command's Run method: Run(ctx context.Context, env *cli.Env) error.
type Env struct {
	// Stdout is where a command writes its output.
	Stdout io.Writer
	// Stderr is where a command writes warnings and diagnostics.
	Stderr io.Writer
	// Kong is the parse context, for commands that need the selected path or the model.
	Kong *kong.Context
}

// ExitError makes [App.Run] exit with Code after printing Err (when not nil).
type ExitError struct {
	// Code is the process exit code.
	Code int
	// Err is printed to stderr unless nil.
	Err error
}

// Error returns the message of the wrapped error.
func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

// Unwrap returns the wrapped error.
func (e *ExitError) Unwrap() error { return e.Err }

// Run parses args (without the program name) into grammar, reports every configuration problem
// at once on stderr, then runs the selected command's Run(ctx context.Context, env *cli.Env)
// error method and returns the process exit code: 0 on success or after --help, [ExitUsage]
// for bad configuration, [ExitFailure] (or an [ExitError]'s code) when the command fails.
func (a App) Run(ctx context.Context, grammar any, args []string) int {
	a = a.withDefaults()
	kctx, err := a.Parse(grammar, args)
	if errors.Is(err, ErrHelp) {
		return 0
	}
	// With --log-format=json every line on stderr is JSON, the final error included.
	if j, ok := grammar.(interface{ JSONLogs() bool }); ok && j.JSONLogs() {
		a.jsonErrors = true
	}
	if err != nil {
		a.printError(err)
		return ExitUsage
	}
	env := &Env{Stdout: a.Stdout, Stderr: a.Stderr, Kong: kctx}
	kctx.BindTo(ctx, (*context.Context)(nil))
	err = kctx.Run(env)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			a.printError(ee.Err)
		}
		return ee.Code
	}
	a.printError(err)
	return ExitFailure
}

func (a App) printError(err error) {
	lines := errorLines(err)
	if a.jsonErrors {
		log := slog.New(slog.NewJSONHandler(a.Stderr, nil))
		for _, l := range lines {
			log.Error(l, "app", a.Name)
		}
		return
	}
	for _, l := range lines {
		fmt.Fprintf(a.Stderr, "%s: error: %s\n", a.Name, l)
	}
}

// errorLines splits a joined error into its problems, one line each.
func errorLines(err error) []string {
	var lines []string
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) && err == joined.(error) { //nolint:errorlint // identity: only a top-level join is split
		for _, e := range joined.Unwrap() {
			lines = append(lines, e.Error())
		}
	} else {
		lines = []string{err.Error()}
	}
	return lines
}

func (a App) withDefaults() App {
	if a.Stdout == nil {
		a.Stdout = os.Stdout
	}
	if a.Stderr == nil {
		a.Stderr = os.Stderr
	}
	return a
}

type helpExit struct{}

// Parse reads args (without the program name) and the environment into grammar, a pointer to a
// kong grammar struct (flags as fields with help:"…" and default:"…" tags, subcommands as
// fields tagged cmd:""). Every flag gets an environment variable from App.EnvPrefix. It returns
// [ErrHelp] after printing help, or an errors.Join of every problem found: values that do not
// parse (naming the flag and, for environment values, the variable) and whatever the
// [FlagValidator]s on the selected command path report.
func (a App) Parse(grammar any, args []string) (kctx *kong.Context, err error) {
	a = a.withDefaults()
	if a.Name == "" || a.EnvPrefix == "" {
		return nil, errors.New("cli: App.Name and App.EnvPrefix are required")
	}
	col := &collector{}
	opts := []kong.Option{
		kong.Name(a.Name),
		kong.Description(a.Description),
		kong.Writers(a.Stdout, a.Stderr),
		kong.DefaultEnvars(a.EnvPrefix),
		kong.ValueFormatter(helpValue),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true, FlagsLast: true}),
		kong.Exit(func(int) { panic(helpExit{}) }),
		kong.WithBeforeReset(func() error { col.phase = phaseReset; return nil }),
		kong.PostBuild(hideSecretPlaceholders),
		kong.Vars{"version": a.Name + " " + Build().String()},
		kong.Resolvers(secretFiles),
	}
	opts = append(opts, col.mappers()...)
	opts = append(opts, a.Options...)
	parser, err := kong.New(grammar, opts...)
	if err != nil {
		return nil, fmt.Errorf("build command line: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(helpExit); !ok {
				panic(r)
			}
			kctx, err = nil, ErrHelp
		}
	}()
	kctx, err = parser.Parse(args)
	if err != nil {
		return nil, err
	}
	decodeErrs, badFlags := col.errors(kctx)
	var problems []error
	problems = append(problems, decodeErrs...)
	fromEnv := envSources(kctx)
	for _, v := range validators(kctx) {
		verr := v.ValidateFlags()
		if verr == nil {
			continue
		}
		for _, e := range flatten(verr) {
			var fe *FlagError
			if errors.As(e, &fe) {
				if badFlags[fe.Flag] {
					continue // the flag's value did not parse; that problem is already reported
				}
				if env, ok := fromEnv[fe.Flag]; ok {
					e = fmt.Errorf("%w (from $%s)", e, env)
				}
			}
			problems = append(problems, e)
		}
	}
	if len(problems) > 0 {
		return nil, errors.Join(dedupe(problems)...)
	}
	return kctx, nil
}

func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// validators returns the FlagValidators of the selected command path, root first, each struct
// once, nested flag groups before the struct that holds them.
func validators(kctx *kong.Context) []FlagValidator {
	var out []FlagValidator
	type key struct {
		addr uintptr
		typ  reflect.Type
	}
	seen := map[key]bool{}
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct || !v.CanAddr() {
			return
		}
		p := v.Addr()
		k := key{p.Pointer(), p.Type()}
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			if _, isCmd := f.Tag.Lookup("cmd"); isCmd {
				continue // commands are on the path themselves when selected
			}
			fv := v.Field(i)
			if fv.Kind() == reflect.Struct || fv.Kind() == reflect.Pointer && fv.Type().Elem().Kind() == reflect.Struct {
				walk(fv)
			}
		}
		if seen[k] {
			return
		}
		if fvd, ok := p.Interface().(FlagValidator); ok {
			seen[k] = true
			out = append(out, fvd)
		}
	}
	for _, tr := range kctx.Path {
		switch {
		case tr.App != nil:
			walk(tr.App.Target)
		case tr.Command != nil:
			walk(tr.Command.Target)
		}
	}
	return out
}

// envSources maps each flag of the selected command path whose value came from its environment
// variable (set, and the flag not given on the command line) to that variable, so that a value
// that parses but fails validation is reported with the variable the user has to fix.
func envSources(kctx *kong.Context) map[string]string {
	onCLI := map[*kong.Value]bool{}
	for _, tr := range kctx.Path {
		if tr.Flag != nil {
			onCLI[tr.Flag.Value] = true
		}
	}
	out := map[string]string{}
	for _, group := range kctx.Flags() {
		if onCLI[group.Value] {
			continue
		}
		for _, env := range group.Tag.Envs {
			if _, ok := os.LookupEnv(env); ok {
				out[group.Name] = env
				break
			}
		}
	}
	return out
}

// FlagError is a problem with one flag's value.
type FlagError struct {
	// Flag is the flag's name without dashes ("batch-size").
	Flag string
	// Err says what is wrong and what to do.
	Err error
}

// Error returns "--flag: problem".
func (e *FlagError) Error() string { return "--" + e.Flag + ": " + e.Err.Error() }

// Unwrap returns the problem.
func (e *FlagError) Unwrap() error { return e.Err }

// Problems collects configuration problems so that all of them are reported together.
// The zero value is ready to use.
type Problems struct {
	errs []error
}

// Add records a problem with flag (its name without dashes).
func (p *Problems) Add(flag, format string, args ...any) {
	p.errs = append(p.errs, &FlagError{Flag: flag, Err: fmt.Errorf(format, args...)})
}

// AddErr records err as a problem with flag, unless err is nil; each error joined in err
// (errors.Join) is a problem of its own.
func (p *Problems) AddErr(flag string, err error) {
	if err == nil {
		return
	}
	for _, e := range flatten(err) {
		p.errs = append(p.errs, &FlagError{Flag: flag, Err: e})
	}
}

// Merge records every problem joined in err (nil adds nothing).
func (p *Problems) Merge(err error) {
	if err != nil {
		p.errs = append(p.errs, flatten(err)...)
	}
}

// Err returns every problem joined, or nil.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// helpValue is the help text of a flag: its help, then its environment variable and default.
// Defaults of Secret and DSN flags are redacted.
func helpValue(v *kong.Value) string {
	h := strings.TrimSuffix(v.Help, ".")
	var extra []string
	if len(v.Tag.Envs) > 0 {
		envs := make([]string, len(v.Tag.Envs))
		for i, e := range v.Tag.Envs {
			envs[i] = "$" + e
		}
		extra = append(extra, strings.Join(envs, ", "))
	}
	if v.HasDefault && v.Default != "" {
		extra = append(extra, "default: "+redactDefault(v))
	}
	if len(extra) > 0 {
		h += " (" + strings.Join(extra, "; ") + ")"
	}
	return h
}

func redactDefault(v *kong.Value) string {
	t := v.Target.Type()
	switch t {
	case reflect.TypeFor[Secret]():
		return Redacted
	case reflect.TypeFor[DSN]():
		return RedactDSN(v.Default)
	}
	return v.Default
}

// hideSecretPlaceholders stops kong from showing a secret default as the flag's placeholder
// (--password="…").
func hideSecretPlaceholders(k *kong.Kong) error {
	var visit func(n *kong.Node)
	visit = func(n *kong.Node) {
		for _, f := range n.Flags {
			if f.PlaceHolder != "" {
				continue
			}
			switch f.Target.Type() {
			case reflect.TypeFor[Secret]():
				f.PlaceHolder = "SECRET"
			case reflect.TypeFor[DSN]():
				f.PlaceHolder = "URL"
			}
		}
		for _, c := range n.Children {
			visit(c)
		}
	}
	visit(k.Model.Node)
	return nil
}

type phase int

const (
	phaseTrace phase = iota // command-line values
	phaseReset              // environment variables and defaults
)

type decodeErr struct {
	phase phase
	err   error
}

// collector turns kong's stop-at-first decode errors into a list: its mappers record a value's
// error and leave the zero value, so parsing goes on and every bad value is reported.
type collector struct {
	phase phase
	errs  map[*kong.Value][]decodeErr
}

func (c *collector) record(v *kong.Value, err error) {
	if c.errs == nil {
		c.errs = map[*kong.Value][]decodeErr{}
	}
	if c.phase == phaseReset {
		for _, env := range v.Tag.Envs {
			if val, ok := os.LookupEnv(env); ok {
				err = fmt.Errorf("%w (from $%s=%q)", err, env, val)
				break
			}
		}
	}
	c.errs[v] = append(c.errs[v], decodeErr{phase: c.phase, err: err})
}

// errors returns the decode errors that matter for the selected command: a value set on the
// command line reports its command-line error (the environment's does not count), any other
// value its environment/default error; values outside the selected path are ignored.
func (c *collector) errors(kctx *kong.Context) ([]error, map[string]bool) {
	onPath := map[*kong.Value]bool{}
	for _, tr := range kctx.Path {
		if n := tr.Node(); n != nil {
			for _, v := range n.Values() {
				onPath[v] = true
			}
		}
	}
	fromCLI := map[*kong.Value]bool{}
	for _, tr := range kctx.Path {
		if tr.Flag != nil {
			fromCLI[tr.Flag.Value] = true
		}
		if tr.Positional != nil {
			fromCLI[tr.Positional] = true
		}
	}
	var out []error
	bad := map[string]bool{}
	for v, errs := range c.errs {
		if !onPath[v] && !fromCLI[v] {
			continue
		}
		want := phaseReset
		if fromCLI[v] {
			want = phaseTrace
		}
		for _, e := range errs {
			if e.phase == want {
				out = append(out, &FlagError{Flag: v.Name, Err: e.err})
				bad[v.Name] = true
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Error() < out[j].Error() })
	return out, bad
}

type lenientMapper struct {
	c     *collector
	inner kong.Mapper
	// numeric lets the value be a negative number given as the next argument.
	numeric bool
}

func (m lenientMapper) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	if m.numeric {
		takeNegativeValue(ctx.Scan)
	}
	if err := m.inner.Decode(ctx, target); err != nil {
		target.Set(reflect.Zero(target.Type()))
		m.c.record(ctx.Value, err)
	}
	return nil
}

// takeNegativeValue makes a negative number that follows a numeric flag ("--batch-size -1")
// the flag's value: kong would read "-1" as the short flag -1 and fail with "expected int value
// but got "-1" (short flag)", hiding the flag's own validation (its name and allowed range). No
// flag of the binaries has a digit or a dot as its short name, so nothing else is lost.
func takeNegativeValue(scan *kong.Scanner) {
	t := scan.Peek()
	s, ok := t.Value.(string)
	if t.Type != kong.UntypedToken || !ok || len(s) < 2 || s[0] != '-' {
		return
	}
	if c := s[1]; (c < '0' || c > '9') && c != '.' {
		return
	}
	scan.Pop()
	scan.PushTyped(s, kong.FlagValueToken)
}

type lenientBoolMapper struct{ lenientMapper }

func (lenientBoolMapper) IsBool() bool { return true }

func (c *collector) mappers() []kong.Option {
	reg := kong.NewRegistry().RegisterDefaults()
	var opts []kong.Option
	for _, k := range []reflect.Kind{
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64,
	} {
		opts = append(opts, kong.KindMapper(k, lenientMapper{c: c, inner: reg.ForType(reflect.New(kindType(k)).Elem().Type()), numeric: true}))
	}
	opts = append(opts,
		kong.KindMapper(reflect.Bool, lenientBoolMapper{lenientMapper{c: c, inner: reg.ForType(reflect.TypeFor[bool]())}}),
		kong.TypeMapper(reflect.TypeFor[time.Duration](), lenientMapper{c: c, inner: reg.ForType(reflect.TypeFor[time.Duration]()), numeric: true}),
	)
	return opts
}

func kindType(k reflect.Kind) reflect.Type {
	switch k {
	case reflect.Int:
		return reflect.TypeFor[int]()
	case reflect.Int8:
		return reflect.TypeFor[int8]()
	case reflect.Int16:
		return reflect.TypeFor[int16]()
	case reflect.Int32:
		return reflect.TypeFor[int32]()
	case reflect.Int64:
		return reflect.TypeFor[int64]()
	case reflect.Uint:
		return reflect.TypeFor[uint]()
	case reflect.Uint8:
		return reflect.TypeFor[uint8]()
	case reflect.Uint16:
		return reflect.TypeFor[uint16]()
	case reflect.Uint32:
		return reflect.TypeFor[uint32]()
	case reflect.Uint64:
		return reflect.TypeFor[uint64]()
	case reflect.Float32:
		return reflect.TypeFor[float32]()
	}
	return reflect.TypeFor[float64]()
}

// dedupe drops repeated messages: a flag group's ValidateFlags is reached twice when the
// method is promoted to the struct that embeds it.
func dedupe(errs []error) []error {
	seen := map[string]bool{}
	out := errs[:0]
	for _, e := range errs {
		if !seen[e.Error()] {
			seen[e.Error()] = true
			out = append(out, e)
		}
	}
	return out
}
