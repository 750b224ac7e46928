package apicurio

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// JavaEnv names the environment variable that chooses the java executable the registry runs
// on, instead of the newest one found.
const JavaEnv = "KEIRO_APICURIO_JAVA"

// JVMDir is where Debian's Java packages and the machine's other JDKs (Temurin's among them)
// are installed, each in a directory of its own.
const JVMDir = "/usr/lib/jvm"

// Java is a Java runtime found on the machine.
type Java struct {
	// Path is the java executable, symbolic links resolved.
	Path string
	// Major is its feature release (17, 21, 25).
	Major int
}

// FindJavas returns the Java runtimes of the machine, newest first and each once: the one
// named by KEIRO_APICURIO_JAVA alone when it is set, else $JAVA_HOME's, the java on PATH and
// those under JVMDir.
func FindJavas(ctx context.Context) ([]Java, error) {
	if p := os.Getenv(JavaEnv); p != "" {
		j, err := inspectJava(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", JavaEnv, p, err)
		}
		return []Java{j}, nil
	}
	var candidates []string
	if home := os.Getenv("JAVA_HOME"); home != "" {
		candidates = append(candidates, filepath.Join(home, "bin", "java"))
	}
	if p, err := exec.LookPath("java"); err == nil {
		candidates = append(candidates, p)
	}
	homes, _ := filepath.Glob(filepath.Join(JVMDir, "*", "bin", "java"))
	candidates = append(candidates, homes...)

	seen := map[string]bool{}
	var out []Java
	for _, c := range candidates {
		j, err := inspectJava(ctx, c)
		if err != nil || seen[j.Path] {
			continue
		}
		seen[j.Path] = true
		out = append(out, j)
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Major > out[b].Major })
	return out, nil
}

// inspectJava resolves path and reads its feature release: from the runtime's release file
// when it has one, else from `java -version`.
func inspectJava(ctx context.Context, path string) (Java, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return Java{}, err
	}
	if st, err := os.Stat(real); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return Java{}, fmt.Errorf("%s is not an executable", real)
	}
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(real)), "release")); err == nil {
		if major, ok := releaseMajor(b); ok {
			return Java{Path: real, Major: major}, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, real, "-version").CombinedOutput()
	if err != nil {
		return Java{}, fmt.Errorf("%s -version: %w", real, err)
	}
	major, ok := versionMajor(string(out))
	if !ok {
		return Java{}, fmt.Errorf("%s -version printed no version: %q", real, out)
	}
	return Java{Path: real, Major: major}, nil
}

// releaseMajor reads JAVA_VERSION="…" from a runtime's release file.
func releaseMajor(release []byte) (int, bool) {
	sc := bufio.NewScanner(bytes.NewReader(release))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "JAVA_VERSION="); ok {
			return parseMajor(strings.Trim(v, `"`))
		}
	}
	return 0, false
}

var versionLine = regexp.MustCompile(`version "([^"]+)"`)

// versionMajor reads the version `java -version` prints (openjdk version "17.0.15" …).
func versionMajor(out string) (int, bool) {
	m := versionLine.FindStringSubmatch(out)
	if m == nil {
		return 0, false
	}
	return parseMajor(m[1])
}

// parseMajor returns the feature release of a Java version string: 17 for "17.0.15", 25 for
// "25", 8 for "1.8.0_392".
func parseMajor(v string) (int, bool) {
	v = strings.TrimPrefix(v, "1.")
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end == 0 {
		return 0, false
	}
	if end > 0 {
		v = v[:end]
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// Choose picks the release to run and the Java to run it on: the release named by version
// (any release when empty, the newest first) on the newest Java that runs it.
func Choose(version string, javas []Java) (Release, Java, error) {
	if len(javas) == 0 {
		return Release{}, Java{}, errors.New("no Java runtime found: the schema registry needs Java 17 " +
			"(e.g. Debian's openjdk-17-jre-headless; Apicurio " + Version + " needs Java 21 or newer, found under " +
			JVMDir + " or named by " + JavaEnv + ")")
	}
	best := javas[0]
	for _, j := range javas[1:] {
		if j.Major > best.Major {
			best = j
		}
	}
	for _, r := range Releases {
		if version != "" && r.Version != version {
			continue
		}
		if best.Major >= r.MinJava {
			return r, best, nil
		}
		if version != "" {
			return Release{}, Java{}, fmt.Errorf("Apicurio Registry %s needs Java %d or newer; the newest found is Java %d (%s): "+
				"install one under %s or name it with %s", r.Version, r.MinJava, best.Major, best.Path, JVMDir, JavaEnv)
		}
	}
	if version != "" {
		return Release{}, Java{}, fmt.Errorf("unknown Apicurio Registry release %q: want one of %s", version, releaseNames())
	}
	return Release{}, Java{}, fmt.Errorf("the newest Java found is Java %d (%s); the schema registry needs Java 17 or newer "+
		"(e.g. Debian's openjdk-17-jre-headless)", best.Major, best.Path)
}

func releaseNames() string {
	names := make([]string, len(Releases))
	for i, r := range Releases {
		names[i] = r.Version
	}
	return strings.Join(names, ", ")
}
