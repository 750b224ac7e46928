package kafkabroker

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/keiro-go/keiro/internal/proc"
)

// Version is the Apache Kafka release the broker runs (pom.xml's kafka.version).
const Version = "4.1.1"

//go:embed pom.xml
var pom []byte

// CacheDir returns the directory that holds the resolved classpath: $KEIRO_KAFKA_CACHE, else
// the user's cache directory (~/.cache/keiro-go/kafka-<Version>). The jars themselves stay in
// Maven's local repository (~/.m2).
func CacheDir() (string, error) {
	if d := os.Getenv("KEIRO_KAFKA_CACHE"); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find a cache directory for the Kafka classpath (set KEIRO_KAFKA_CACHE): %w", err)
	}
	return filepath.Join(base, "keiro-go", "kafka-"+Version), nil
}

// Classpath returns the broker's Java classpath, asking Maven to resolve pom.xml the first
// time on a machine (a minute or so while the jars download) and reading the cached answer
// afterwards. Concurrent callers, in this process or others, wait for one resolution.
func Classpath(ctx context.Context) (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	unlock, err := proc.LockDir(dir, "Kafka classpath")
	if err != nil {
		return "", err
	}
	defer unlock()

	cpFile := filepath.Join(dir, "classpath")
	pomFile := filepath.Join(dir, "pom.xml")
	if cp, ok := cached(cpFile, pomFile); ok {
		return cp, nil
	}
	if err := os.WriteFile(pomFile+".new", pom, 0o644); err != nil {
		return "", fmt.Errorf("write the broker's pom.xml: %w", err)
	}
	if _, err := exec.LookPath("mvn"); err != nil {
		return "", errors.New("mvn not found: the real Kafka broker is resolved by Maven " +
			"(install Java 17 and Maven 3, e.g. Debian's openjdk-17-jre-headless and maven), " +
			"or point the tests at a running broker with KEIRO_TEST_KAFKA_BROKERS=host:port")
	}
	tmp := cpFile + ".new"
	cmd := exec.CommandContext(ctx, "mvn", "-q", "-B", "-f", pomFile+".new",
		"dependency:build-classpath", "-Dmdep.includeScope=runtime", "-Dmdep.outputFile="+tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("resolve Apache Kafka %s with Maven (%s): %w\n%s", Version, pomFile, err, tail(out.String(), 40))
	}
	if err := os.Rename(pomFile+".new", pomFile); err != nil {
		return "", fmt.Errorf("keep the broker's pom.xml: %w", err)
	}
	if err := os.Rename(tmp, cpFile); err != nil {
		return "", fmt.Errorf("keep the resolved classpath: %w", err)
	}
	cp, ok := cached(cpFile, pomFile)
	if !ok {
		return "", fmt.Errorf("Maven resolved Apache Kafka %s but %s names a jar that is missing", Version, cpFile)
	}
	return cp, nil
}

// cached returns the classpath in cpFile when it was resolved from today's pom and every jar
// it names is still there.
func cached(cpFile, pomFile string) (string, bool) {
	old, err := os.ReadFile(pomFile)
	if err != nil || !bytes.Equal(old, pom) {
		return "", false
	}
	b, err := os.ReadFile(cpFile)
	if err != nil {
		return "", false
	}
	cp := strings.TrimSpace(string(b))
	if cp == "" {
		return "", false
	}
	for _, jar := range filepath.SplitList(cp) {
		if _, err := os.Stat(jar); err != nil {
			return "", false
		}
	}
	return cp, true
}

// tail returns the last n lines of s.
func tail(s string, n int) string { return proc.Tail(s, n) }
