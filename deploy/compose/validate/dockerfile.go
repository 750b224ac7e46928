package validate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// Instruction is one Dockerfile instruction, continuation lines joined, as BuildKit's parser
// reads it.
type Instruction struct {
	// Line is the 1-based line the instruction starts on.
	Line int
	// Cmd is the instruction keyword, upper case ("FROM", "COPY", …).
	Cmd string
	// Flags are the leading --flag[=value] words.
	Flags []string
	// Args are BuildKit's arguments: the words (COPY, FROM, EXPOSE), the elements of the JSON
	// array in exec form, the whole command in shell form (RUN, CMD), key, value, "=" triples
	// (ENV, LABEL).
	Args []string
	// JSON is true for the exec form (a JSON array).
	JSON bool
	// Raw is the text after the keyword.
	Raw string
}

// Flag returns the value of --name=value, if present.
func (in Instruction) Flag(name string) (string, bool) {
	for _, f := range in.Flags {
		if v, ok := strings.CutPrefix(f, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// Stage is one FROM stage.
type Stage struct {
	// Name is the stage's AS name; empty when unnamed.
	Name string
	// Base is the FROM image or stage, with global ARG defaults expanded.
	Base string
	// From is the FROM instruction.
	From Instruction
	// Instructions are the stage's instructions after FROM.
	Instructions []Instruction
}

// Dockerfile is a parsed Dockerfile: the global ARG defaults and the stages.
type Dockerfile struct {
	// Path is the file parsed.
	Path string
	// Args are the ARG defaults declared before the first FROM.
	Args map[string]string
	// Stages are the FROM stages in order.
	Stages []Stage
}

// StageNames returns the names of the named stages, in order.
func (d *Dockerfile) StageNames() []string {
	var names []string
	for _, s := range d.Stages {
		if s.Name != "" {
			names = append(names, s.Name)
		}
	}
	return names
}

// ParseDockerfile reads the Dockerfile at path with BuildKit's own parser (the one `docker
// build` uses: parser directives, escapes, continuation lines with comments, JSON exec form,
// heredocs). It fails on a syntax error, on an instruction before the first FROM other than
// ARG, and on a malformed FROM.
func ParseDockerfile(file string) (*Dockerfile, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("parse Dockerfile: %w", err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", file, err)
	}
	d := &Dockerfile{Path: file, Args: map[string]string{}}
	for _, n := range res.AST.Children {
		in := instruction(n)
		switch {
		case in.Cmd == "FROM":
			st, err := parseFrom(in, d.Args)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", file, in.Line, err)
			}
			d.Stages = append(d.Stages, st)
		case len(d.Stages) == 0 && in.Cmd == "ARG":
			for _, a := range in.Args {
				k, v, _ := strings.Cut(a, "=")
				d.Args[k] = v
			}
		case len(d.Stages) == 0:
			return nil, fmt.Errorf("%s:%d: %s before the first FROM", file, in.Line, in.Cmd)
		default:
			st := &d.Stages[len(d.Stages)-1]
			st.Instructions = append(st.Instructions, in)
		}
	}
	if len(d.Stages) == 0 {
		return nil, fmt.Errorf("%s: no FROM instruction", file)
	}
	return d, nil
}

// instruction converts one node of BuildKit's syntax tree.
func instruction(n *parser.Node) Instruction {
	in := Instruction{Line: n.StartLine, Cmd: strings.ToUpper(n.Value), Flags: n.Flags, JSON: n.Attributes["json"]}
	if _, rest, ok := strings.Cut(strings.TrimSpace(n.Original), " "); ok {
		in.Raw = strings.TrimSpace(rest)
	}
	for a := n.Next; a != nil; a = a.Next {
		in.Args = append(in.Args, a.Value)
	}
	return in
}

var argRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

func parseFrom(in Instruction, args map[string]string) (Stage, error) {
	st := Stage{From: in}
	switch {
	case len(in.Args) == 1:
	case len(in.Args) == 3 && strings.EqualFold(in.Args[1], "AS"):
		st.Name = strings.ToLower(in.Args[2])
	default:
		return st, fmt.Errorf("FROM %s: want FROM <image> [AS <name>]", in.Raw)
	}
	st.Base = argRef.ReplaceAllStringFunc(in.Args[0], func(ref string) string {
		return args[argRef.FindStringSubmatch(ref)[1]]
	})
	return st, nil
}

// imageRef matches a plausible image reference: lowercase name components with an optional
// registry, tag and digest.
var imageRef = regexp.MustCompile(`^[a-z0-9]+([._/:-][a-z0-9]+)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$`)

// CheckDockerfile reports every problem of the Dockerfile at path, built with the context
// directory contextDir, at once (joined), or nil: stage names defined twice; FROM or COPY
// --from naming a stage not defined before it; bases that are not image references; COPY/ADD
// sources missing from the context or excluded by its .dockerignore; `go build` packages that
// do not exist; Go sources or go:embed files of the module that .dockerignore excludes; and,
// for every runnable [Image]: running as root, an HTTP client, missing OCI labels, a keiro
// binary listening on loopback or on a port it does not EXPOSE.
func CheckDockerfile(dockerfile, contextDir string) error {
	d, err := ParseDockerfile(dockerfile)
	if err != nil {
		return err
	}
	ignore, err := loadDockerignore(filepath.Join(contextDir, ".dockerignore"))
	if err != nil {
		return err
	}
	var errs []error
	add := func(in Instruction, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s: "+format, append([]any{filepath.Base(dockerfile), in.Line, in.Cmd}, args...)...))
	}
	defined := map[string]bool{}
	later := map[string]bool{}
	for _, s := range d.Stages {
		if s.Name != "" {
			later[s.Name] = true
		}
	}
	for i, s := range d.Stages {
		switch {
		case defined[s.Base]:
		case later[s.Base]:
			add(s.From, "stage %q is used before it is defined", s.Base)
		case !imageRef.MatchString(s.Base):
			add(s.From, "%q is neither an earlier stage nor an image reference", s.Base)
		}
		for _, in := range s.Instructions {
			switch in.Cmd {
			case "COPY", "ADD":
				if len(in.Args) < 2 {
					add(in, "needs a source and a destination")
					continue
				}
				if from, ok := in.Flag("from"); ok {
					n, numErr := strconv.Atoi(from)
					switch {
					case numErr == nil:
						if n < 0 || n >= i {
							add(in, "--from=%d is not an earlier stage index", n)
						}
					case defined[strings.ToLower(from)]:
					case later[strings.ToLower(from)] || strings.ToLower(from) == s.Name:
						add(in, "--from=%s names a stage that is not defined before this one", from)
					case !imageRef.MatchString(from) || !strings.ContainsAny(from, ":/@"):
						// A bare name is far more likely a misspelt stage than an image.
						add(in, "--from=%s is neither a defined stage nor an image reference with a tag, digest or registry path", from)
					}
					continue
				}
				for _, src := range in.Args[:len(in.Args)-1] {
					if in.Cmd == "ADD" && strings.Contains(src, "://") {
						continue
					}
					rel := path.Clean(strings.TrimPrefix(filepath.ToSlash(src), "/"))
					matches, _ := filepath.Glob(filepath.Join(contextDir, filepath.FromSlash(rel)))
					if len(matches) == 0 {
						add(in, "source %q does not exist in the build context", src)
					} else if rel != "." && ignore.excludes(rel) {
						add(in, "source %q is excluded by .dockerignore", src)
					}
				}
			case "RUN":
				for _, pkg := range goBuildPackages(in.Raw) {
					rel := path.Clean(pkg)
					if err := checkMainPackage(filepath.Join(contextDir, filepath.FromSlash(rel))); err != nil {
						add(in, "go build %s: %v", pkg, err)
					} else if ignore.excludes(rel) {
						add(in, "go build %s: excluded by .dockerignore", pkg)
					}
				}
			}
		}
		if s.Name != "" {
			if defined[s.Name] {
				add(s.From, "stage %q is defined twice", s.Name)
			}
			defined[s.Name] = true
		}
	}
	for _, img := range d.Images() {
		errs = append(errs, checkImage(img)...)
	}
	errs = append(errs, checkModuleNotIgnored(contextDir, ignore)...)
	return errors.Join(errs...)
}

// goBuildPackages returns the ./relative package arguments of `go build` commands in a RUN.
func goBuildPackages(run string) []string {
	var pkgs []string
	for _, cmd := range regexp.MustCompile(`&&|;|\|\|`).Split(run, -1) {
		words := strings.Fields(cmd)
		i := slices.Index(words, "go")
		if i < 0 || i+1 >= len(words) || words[i+1] != "build" {
			continue
		}
		for _, w := range words[i+2:] {
			if strings.HasPrefix(w, "./") {
				pkgs = append(pkgs, strings.TrimSuffix(w, "/..."))
			}
		}
	}
	return pkgs
}

// checkMainPackage reports whether dir holds a non-test Go file of package main.
func checkMainPackage(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("package directory does not exist")
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil && regexp.MustCompile(`(?m)^package main\b`).Match(b) {
			return nil
		}
	}
	return fmt.Errorf("no non-test Go file of package main in %s", dir)
}

var embedLine = regexp.MustCompile(`(?m)^//go:embed\s+(.+)$`)

// checkModuleNotIgnored reports module files a build needs (non-test .go files outside nested
// modules and testdata, and the files their go:embed patterns name) that .dockerignore
// excludes.
func checkModuleNotIgnored(root string, ignore *dockerignore) []error {
	var errs []error
	_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if e.IsDir() {
			if rel != "." && (strings.HasPrefix(e.Name(), ".") || e.Name() == "testdata") {
				return filepath.SkipDir
			}
			if rel != "." {
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir // a nested module is not part of this build
				}
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		if ignore.excludes(rel) {
			errs = append(errs, fmt.Errorf(".dockerignore excludes %s, which the build compiles", rel))
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, m := range embedLine.FindAllSubmatch(b, -1) {
			for _, pat := range strings.Fields(string(m[1])) {
				files, _ := filepath.Glob(filepath.Join(filepath.Dir(p), filepath.FromSlash(pat)))
				for _, f := range files {
					r, _ := filepath.Rel(root, f)
					if ignore.excludes(filepath.ToSlash(r)) {
						errs = append(errs, fmt.Errorf(".dockerignore excludes %s, which %s embeds", filepath.ToSlash(r), rel))
					}
				}
			}
		}
		return nil
	})
	return errs
}

// dockerignore is the build context's .dockerignore, matched by Docker's own matcher
// (github.com/moby/patternmatcher): the last matching pattern wins, "!" negates, "**" spans
// directories, character classes work, and a pattern that matches a directory excludes
// everything below it.
type dockerignore struct {
	pm *patternmatcher.PatternMatcher // nil when there is no .dockerignore
}

func loadDockerignore(file string) (*dockerignore, error) {
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return &dockerignore{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read .dockerignore: %w", err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read .dockerignore: %w", err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	return &dockerignore{pm: pm}, nil
}

// excludes reports whether rel (slash-separated, relative to the context) is excluded.
func (d *dockerignore) excludes(rel string) bool {
	if d.pm == nil {
		return false
	}
	excluded, err := d.pm.MatchesOrParentMatches(filepath.FromSlash(rel))
	return err == nil && excluded
}
