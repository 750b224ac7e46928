// Package apicurio runs Apicurio Registry on loopback for tests: a real schema registry whose
// /apis/ccompat/v7 API is Confluent Schema Registry's, with in-memory storage. The release comes
// from Maven (io.apicurio:apicurio-registry-app), is unpacked once per machine, and runs as a JVM
// child process that dies with the process that started it.
//
// Two releases are known: Version (the current line, which needs Java 21 or newer) and
// LegacyVersion (which runs on Java 17). Start runs Version when the machine has a Java 21+
// (Temurin's JDK under /usr/lib/jvm, $JAVA_HOME, or KEIRO_APICURIO_JAVA), else LegacyVersion on
// Java 17; both answer the Confluent API with Confluent's error codes.
package apicurio

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/keiro-go/keiro/internal/proc"
)

// The releases Start knows.
const (
	// Version is the release run when a Java 21 or newer is found.
	Version = "3.3.3"
	// LegacyVersion is the release run on Java 17.
	LegacyVersion = "2.6.13.Final"
)

// CompatPath is the path of the Confluent-compatible API under a registry's base URL.
const CompatPath = "/apis/ccompat/v7"

// Defaults of Config.
const (
	// DefaultHeapMB bounds the registry JVM's heap.
	DefaultHeapMB = 384
	// DefaultStartTimeout bounds the wait for the registry to answer after it was started.
	DefaultStartTimeout = 2 * time.Minute
)

// Release is one release of Apicurio Registry as Maven serves it.
type Release struct {
	// Version is the release's version.
	Version string
	// Artifact is its archive's Maven coordinates (group:artifact:version:type:classifier).
	Artifact string
	// Jar is the runnable jar, relative to the unpacked archive.
	Jar string
	// MinJava is the oldest Java feature release it runs on.
	MinJava int
	// Props are the release's own system properties, set after the package's common ones.
	Props []string
}

// Releases are the releases Start knows, preferred first.
var Releases = []Release{
	{Version: Version, Artifact: "io.apicurio:apicurio-registry-app:" + Version + ":tar.gz:all",
		Jar: "quarkus-run.jar", MinJava: 21,
		// Look a schema up by its canonical form, as Confluent's registry does: the same
		// schema with other whitespace or key order is found.
		Props: []string{"-Dapicurio.ccompat.use-canonical-hash=true"}},
	{Version: LegacyVersion, Artifact: "io.apicurio:apicurio-registry-app:" + LegacyVersion + ":zip:all",
		Jar: "apicurio-registry-app-" + LegacyVersion + "-runner.jar", MinJava: 17,
		Props: []string{"-Dregistry.ccompat.use-canonical-hash=true"}},
}

// Config configures Start.
type Config struct {
	// Version is the release to run, one of Releases. Defaults to the first release the
	// newest Java found runs (Version on Java 21+, LegacyVersion on Java 17).
	Version string
	// Java is the java executable to run it on. Defaults to the newest Java found (FindJavas:
	// KEIRO_APICURIO_JAVA, else $JAVA_HOME, PATH and JVMDir).
	Java string
	// HeapMB is the JVM's maximum heap. Defaults to DefaultHeapMB.
	HeapMB int
	// Dir holds the registry's log (<Dir>/registry.log). Defaults to a new temporary
	// directory, removed by Close.
	Dir string
	// StartTimeout bounds the wait for the registry to answer. Defaults to DefaultStartTimeout.
	StartTimeout time.Duration
}

// Registry is a running Apicurio Registry on loopback.
type Registry struct {
	// URL is the Confluent-compatible API's base URL (http://127.0.0.1:<port>/apis/ccompat/v7),
	// what a Confluent client is given.
	URL string
	// Release is the release running.
	Release Release
	// Java is the runtime it runs on.
	Java Java
	// ManagementAddr is the management interface's address (health, metrics), on loopback;
	// the 3.x line opens it, 2.x serves health on the API's port instead.
	ManagementAddr string

	dir     proc.RunDir
	p       *proc.Process
	closing sync.Once
}

// Start finds a Java, fetches the release (once per machine), starts it on free loopback ports
// (the HTTP API and the management interface) and waits until the Confluent API answers.
// Close stops it.
func Start(ctx context.Context, cfg Config) (*Registry, error) {
	if cfg.HeapMB == 0 {
		cfg.HeapMB = DefaultHeapMB
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	var javas []Java
	if cfg.Java != "" {
		j, err := inspectJava(ctx, cfg.Java)
		if err != nil {
			return nil, fmt.Errorf("apicurio: Config.Java %s: %w", cfg.Java, err)
		}
		javas = []Java{j}
	} else {
		var err error
		if javas, err = FindJavas(ctx); err != nil {
			return nil, fmt.Errorf("apicurio: %w", err)
		}
	}
	rel, java, err := Choose(cfg.Version, javas)
	if err != nil {
		return nil, fmt.Errorf("apicurio: %w", err)
	}
	app, err := Fetch(ctx, rel)
	if err != nil {
		return nil, fmt.Errorf("apicurio: %w", err)
	}
	dir, err := proc.NewRunDir(cfg.Dir, "keiro-apicurio-")
	if err != nil {
		return nil, fmt.Errorf("apicurio: %w", err)
	}
	r := &Registry{Release: rel, Java: java, dir: dir}
	ok := false
	defer func() {
		if !ok {
			r.Close()
		}
	}()
	ports, err := proc.FreePorts(2)
	if err != nil {
		return nil, fmt.Errorf("apicurio: %w", err)
	}
	base := "http://" + addr(ports[0])
	r.URL = base + CompatPath
	r.ManagementAddr = addr(ports[1])
	args := []string{
		"-Xms64m", fmt.Sprintf("-Xmx%dm", cfg.HeapMB), "-XX:+UseSerialGC",
		// C1 only: the registry starts in about half the time, and a test's few hundred
		// requests never warm C2 up anyway.
		"-XX:TieredStopAtLevel=1",
		"-Djava.awt.headless=true",
		"-Dquarkus.http.host=127.0.0.1",
		"-Dquarkus.http.port=" + strconv.Itoa(ports[0]),
		"-Dquarkus.management.host=127.0.0.1",
		"-Dquarkus.management.port=" + strconv.Itoa(ports[1]),
		"-Dquarkus.log.level=WARN",
		"-Dquarkus.log.category.\"io.quarkus\".level=INFO",
	}
	args = append(append(args, rel.Props...), "-jar", filepath.Join(app, rel.Jar))
	if r.p, err = proc.Start(r.LogPath(), r.dir.Path, java.Path, args); err != nil {
		return nil, fmt.Errorf("apicurio: start %s: %w", java.Path, err)
	}
	if err := r.waitReady(ctx, base, cfg.StartTimeout); err != nil {
		return nil, err
	}
	ok = true
	return r, nil
}

// waitReady polls the subject list until it answers 200.
func (r *Registry) waitReady(ctx context.Context, base string, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	err := r.p.WaitReady(ctx, "Apicurio Registry "+r.Release.Version, timeout, 100*time.Millisecond,
		func() string { return r.logTail(40) },
		func(ctx context.Context) error { return probe(ctx, client, base+CompatPath+"/subjects") })
	if err != nil {
		return fmt.Errorf("apicurio: %w", err)
	}
	return nil
}

func probe(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// LogPath is the file the registry's JVM writes its output to.
func (r *Registry) LogPath() string { return filepath.Join(r.dir.Path, "registry.log") }

func (r *Registry) logTail(lines int) string { return proc.TailFile(r.LogPath(), lines) }

// Running reports whether the registry's process is alive.
func (r *Registry) Running() bool { return r.p != nil && !r.p.Exited() }

// Close kills the registry, waits for it to exit and removes the run directory when Start made
// it. Safe to call more than once.
func (r *Registry) Close() {
	r.closing.Do(func() {
		r.p.Kill(time.Minute)
		r.dir.Remove("KEIRO_APICURIO_KEEP")
	})
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
