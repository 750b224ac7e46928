package apicurio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/keiro-go/keiro/internal/proc"
)

// CacheEnv names the environment variable that moves the per-machine cache of unpacked
// releases (default: the user's cache directory, keiro-go/apicurio-<version>).
const CacheEnv = "KEIRO_APICURIO_CACHE"

// dependencyPlugin is the Maven plugin that fetches and unpacks a release: the version the Kafka
// broker's pom.xml pins.
const dependencyPlugin = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

// CacheDir returns the directory that holds release r unpacked: $KEIRO_APICURIO_CACHE/<version>,
// else the user's cache directory (~/.cache/keiro-go/apicurio-<version>). The archive itself
// stays in Maven's local repository (~/.m2).
func CacheDir(r Release) (string, error) {
	return proc.CacheDir(CacheEnv, "apicurio", r.Version, "Apicurio Registry")
}

// Fetch returns the directory of release r unpacked, asking Maven to download and unpack its
// archive the first time on a machine and reusing it afterwards. Concurrent callers, in this
// process or others, wait for one download.
func Fetch(ctx context.Context, r Release) (string, error) {
	dir, err := CacheDir(r)
	if err != nil {
		return "", err
	}
	unlock, err := proc.LockDir(dir, "Apicurio Registry")
	if err != nil {
		return "", err
	}
	defer unlock()

	app := filepath.Join(dir, "app")
	marker := filepath.Join(dir, "unpacked")
	if old, err := os.ReadFile(marker); err == nil && string(old) == r.Artifact {
		if _, err := os.Stat(filepath.Join(app, r.Jar)); err == nil {
			return app, nil
		}
	}
	if _, err := exec.LookPath("mvn"); err != nil {
		return "", errors.New("mvn not found: the schema registry (Apicurio Registry) is fetched by Maven " +
			"(install Maven 3, e.g. Debian's maven), or point the tests at a running registry with " +
			"KEIRO_TEST_SCHEMA_REGISTRY_URL=http://host:port/apis/ccompat/v7")
	}
	_ = os.Remove(marker)
	tmp := app + ".new"
	if err := os.RemoveAll(tmp); err != nil {
		return "", fmt.Errorf("clear %s: %w", tmp, err)
	}
	cmd := exec.CommandContext(ctx, "mvn", "-q", "-B", dependencyPlugin+":unpack",
		"-Dartifact="+r.Artifact, "-DoutputDirectory="+tmp)
	cmd.Dir = dir // no pom.xml here: Maven runs the goal on its standalone project
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("fetch Apicurio Registry %s (%s) with Maven: %w\n%s", r.Version, r.Artifact, err, proc.Tail(out.String(), 40))
	}
	if _, err := os.Stat(filepath.Join(tmp, r.Jar)); err != nil {
		return "", fmt.Errorf("Maven unpacked %s but it has no %s", r.Artifact, r.Jar)
	}
	if err := os.RemoveAll(app); err != nil {
		return "", fmt.Errorf("clear %s: %w", app, err)
	}
	if err := os.Rename(tmp, app); err != nil {
		return "", fmt.Errorf("keep the unpacked registry: %w", err)
	}
	if err := os.WriteFile(marker, []byte(r.Artifact), 0o644); err != nil {
		return "", fmt.Errorf("mark the registry unpacked: %w", err)
	}
	return app, nil
}
