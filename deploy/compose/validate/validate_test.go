package validate_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/deploy/compose/validate"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// repoRoot is the repository root, three directories above this file.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// TestComposeFile loads the repository's docker-compose.yml with compose-go and checks it.
func TestComposeFile(t *testing.T) {
	root := repoRoot(t)
	p, err := validate.LoadProject(context.Background(), filepath.Join(root, "docker-compose.yml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"postgres", "kafka", "schema-registry", "jaeger", "prometheus", "grafana", "relay", "consumer", "kafka-init", "demo-orders"} {
		if _, ok := p.Services[want]; !ok {
			t.Errorf("service %q missing", want)
		}
	}
	if err := validate.CheckProject(p); err != nil {
		t.Fatal(err)
	}
	// The stack's Kafka is the release the real-broker tests run, so the two cannot drift.
	for _, name := range []string{"kafka", "kafka-init"} {
		if want := "apache/kafka:" + testenv.KafkaVersion; p.Services[name].Image != want {
			t.Errorf("service %q runs %s, want %s (testenv.KafkaVersion, the broker the tests run)", name, p.Services[name].Image, want)
		}
	}
	// So is the compose test's local Kafka image (deploy/compose/local/kafka, built from Maven).
	pom, err := os.ReadFile(filepath.Join(root, "deploy", "compose", "local", "kafka", "pom.xml"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "<kafka.version>" + testenv.KafkaVersion + "</kafka.version>"; !strings.Contains(string(pom), want) {
		t.Errorf("deploy/compose/local/kafka/pom.xml does not pin %s (testenv.KafkaVersion)", want)
	}
	// And its schema registry is the Apicurio release the kit runs on Java 17.
	for _, f := range []string{"build-images", filepath.Join("apicurio", "Dockerfile")} {
		b, err := os.ReadFile(filepath.Join(root, "deploy", "compose", "local", f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), testenv.SchemaRegistryLegacyVersion) {
			t.Errorf("deploy/compose/local/%s does not name Apicurio %s (testenv.SchemaRegistryLegacyVersion)", f, testenv.SchemaRegistryLegacyVersion)
		}
	}
	// Interpolation: a host port moved through the environment is honoured and still checked.
	p, err = validate.LoadProject(context.Background(), filepath.Join(root, "docker-compose.yml"), []string{"KEIRO_RELAY_PORT=9465"})
	if err != nil {
		t.Fatal(err)
	}
	err = validate.CheckProject(p)
	if err == nil || !strings.Contains(err.Error(), "host port 9465/tcp") {
		t.Fatalf("moving the relay onto the consumer's port: err = %v", err)
	}
}

// TestDockerfile checks the repository's Dockerfile against its build context.
func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	if err := validate.CheckDockerfile(filepath.Join(root, "Dockerfile"), root); err != nil {
		t.Fatal(err)
	}
	d, err := validate.ParseDockerfile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	names := strings.Join(d.StageNames(), ",")
	for _, want := range []string{"build", "relay", "consumer"} {
		if !strings.Contains(","+names+",", ","+want+",") {
			t.Errorf("stage %q missing (stages %s)", want, names)
		}
	}
	if !strings.HasPrefix(d.Stages[0].Base, "golang:1.26") {
		t.Errorf("builder base = %q, want golang:1.26…", d.Stages[0].Base)
	}
}

// writeTree writes files (path → content) under a new temporary directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const goodDockerfile = `FROM golang:1.26 AS build
COPY go.mod ./
COPY . .
RUN go build -o /out/ ./cmd/relay
FROM debian:bookworm-slim AS relay
COPY --from=build /out/relay /relay
`

func TestCheckProjectFindsProblems(t *testing.T) {
	compose := `
services:
  db:
    image: postgres:16
    ports: ["127.0.0.1:5432:5432"]
  web:
    image: nginx
    ports: ["5432:80", "9000-9002:9000-9002"]
    volumes:
      - ./missing-dir:/etc/x:ro
      - ./present:/etc/y:ro
    depends_on:
      db:
        condition: service_healthy
  relay:
    build:
      context: .
      target: nosuchstage
    environment:
      KEIRO_RELAY_DATABASE_URL: postgres://x
      KEIRO_RELAY_BROKER: typo:9092
      OTEL_SERVICE_NAME: relay
      OTEL_TRACE_SAMPLER: always_on
    ports: ["9001:8080"]
  other:
    build:
      context: ./nowhere
    environment:
      KEIRO_CONSUMER_GROUP: g
    healthcheck:
      test: ["CMD", "true"]
  worker:
    image: busybox
    restart: always
  after:
    image: busybox
    depends_on:
      worker:
        condition: service_completed_successfully
`
	dir := writeTree(t, map[string]string{
		"docker-compose.yml": compose,
		"Dockerfile":         goodDockerfile,
		"present/file":       "x",
	})
	p, err := validate.LoadProject(context.Background(), filepath.Join(dir, "docker-compose.yml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = validate.CheckProject(p)
	if err == nil {
		t.Fatal("CheckProject accepted a broken project")
	}
	for _, want := range []string{
		`service "web": waits for "db" to be healthy, but "db" has no healthcheck`,
		`service "web": host port 5432/tcp is also published by "db"`,
		`service "web": host port 9001/tcp is also published by "relay"`,
		`service "web": mounts host path ` + filepath.Join(dir, "missing-dir"),
		`service "relay": build target "nosuchstage" is not a stage`,
		`service "relay": is built from the repository but has no healthcheck`,
		`service "relay": KEIRO_RELAY_BROKER is not read by relay`,
		`service "relay": KEIRO_RELAY_BROKERS is required by relay but not set`,
		`service "relay": OTEL_TRACE_SAMPLER is not an OpenTelemetry variable`,
		`service "other": build context ` + filepath.Join(dir, "nowhere") + ` does not exist`,
		`service "other": sets KEIRO_CONSUMER_GROUP, but it runs no keiro binary`,
		`service "after": waits for "worker" to complete, but "worker" restarts (always)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("problems do not include %q", want)
		}
	}
	if strings.Contains(err.Error(), "present") {
		t.Errorf("an existing mount was reported: %v", err)
	}
	if t.Failed() {
		t.Logf("problems:\n%v", err)
	}
}

func TestLoadProjectRejectsInvalidFiles(t *testing.T) {
	for name, compose := range map[string]string{
		"yaml syntax":         "services:\n  a: [",
		"unknown key":         "services:\n  a:\n    image: x\n    imagee: y\n",
		"undefined depends":   "services:\n  a:\n    image: x\n    depends_on: [b]\n",
		"undefined volume":    "services:\n  a:\n    image: x\n    volumes: [data:/data]\n",
		"bad port":            "services:\n  a:\n    image: x\n    ports: [\"notaport\"]\n",
		"missing image/build": "services:\n  a:\n    command: x\n",
	} {
		t.Run(name, func(t *testing.T) {
			dir := writeTree(t, map[string]string{"docker-compose.yml": compose})
			if _, err := validate.LoadProject(context.Background(), filepath.Join(dir, "docker-compose.yml"), nil); err == nil {
				t.Fatal("LoadProject accepted an invalid file")
			}
		})
	}
}

func TestCheckDockerfileFindsProblems(t *testing.T) {
	cases := []struct {
		name       string
		dockerfile string
		extra      map[string]string
		want       []string
	}{
		{"good", goodDockerfile, nil, nil},
		{"copy from undefined stage", goodDockerfile + "COPY --from=builder /x /y\n", nil, []string{`--from=builder is neither a defined stage`}},
		{"copy from later stage", "FROM alpine AS a\nCOPY --from=b /x /y\nFROM alpine AS b\n", nil, []string{`--from=b names a stage that is not defined before this one`}},
		{"copy from later index", "FROM alpine AS a\nCOPY --from=1 /x /y\nFROM alpine AS b\n", nil, []string{`--from=1 is not an earlier stage index`}},
		{"from later stage", "FROM later AS a\nFROM alpine AS later\n", nil, []string{`stage "later" is used before it is defined`}},
		{"duplicate stage", "FROM alpine AS a\nFROM alpine AS a\n", nil, []string{`stage "a" is defined twice`}},
		{"copy from image and earlier stages", "FROM alpine AS a\nCOPY --from=busybox:1.36-musl /bin/busybox /bin/\nFROM alpine\nCOPY --from=0 /x /y\nCOPY --from=a /x /y\n", nil, nil},
		{"missing copy source", "FROM alpine\nCOPY go.sum nothing-here/ /src/\n", nil, []string{`source "go.sum" does not exist`, `source "nothing-here/" does not exist`}},
		{"ignored copy source", "FROM alpine\nCOPY cmd/relay /src/\n", map[string]string{".dockerignore": "cmd\n"}, []string{`source "cmd/relay" is excluded by .dockerignore`}},
		{"missing go package", "FROM golang:1.26\nCOPY . .\nRUN go build -o /out/ ./cmd/relay ./cmd/nope && echo ok\n", nil, []string{`go build ./cmd/nope: package directory does not exist`}},
		{"not a main package", "FROM golang:1.26\nRUN go build ./lib\n", map[string]string{"lib/lib.go": "package lib\n"}, []string{`go build ./lib: no non-test Go file of package main`}},
		{"ignored Go source", goodDockerfile, map[string]string{".dockerignore": "**/*.go\n!cmd/relay/*.go\n"}, []string{`.dockerignore excludes lib/lib.go`}},
		{"ignored embed", goodDockerfile, map[string]string{".dockerignore": "**/*.sql\n"}, []string{`.dockerignore excludes lib/sql/001.sql, which lib/lib.go embeds`}},
		{"negated ignore keeps file", goodDockerfile, map[string]string{".dockerignore": "lib\n!lib/lib.go\n!lib/sql\n"}, nil},
		{"instruction before FROM", "RUN true\nFROM alpine\n", nil, []string{`RUN before the first FROM`}},
		{"bad FROM", "FROM alpine AS\n", nil, []string{`want FROM <image> [AS <name>]`}},
		{"bad image", "FROM Not An Image\n", nil, []string{`want FROM <image>`}},
		{"uppercase image", "FROM Alpine\n", nil, []string{`"Alpine" is neither an earlier stage nor an image reference`}},
		// Docker's matcher: character classes match (a hand-written glob took "[" literally).
		{"ignore character class", goodDockerfile, map[string]string{".dockerignore": "lib/[a-z]*.go\n"}, []string{`.dockerignore excludes lib/lib.go`}},
		// BuildKit's parser honours the escape directive (Windows-style backtick continuation).
		{"escape directive", "# escape=`\nFROM alpine AS a\nCOPY `\n  missing.txt `\n  /dst/\n", nil, []string{`:3: COPY: source "missing.txt" does not exist`}},
		{"heredoc is not an instruction", "FROM alpine AS a\nRUN <<EOT\nset -e\nFROM nowhere\nEOT\n", nil, nil},
		{"continuation lines", "FROM alpine AS a\nCOPY \\\n  # a comment\n  missing.txt \\\n  /dst/\n", nil, []string{`:2: COPY: source "missing.txt" does not exist`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			files := map[string]string{
				"go.mod":            "module example.com/x\n",
				"cmd/relay/main.go": "package main\n\nfunc main() {}\n",
				"lib/lib.go":        "package lib\n\nimport _ \"embed\"\n\n//go:embed sql/*.sql\nvar s string\n",
				"lib/sql/001.sql":   "select 1;\n",
				"Dockerfile":        c.dockerfile,
			}
			for k, v := range c.extra {
				files[k] = v
			}
			dir := writeTree(t, files)
			err := validate.CheckDockerfile(filepath.Join(dir, "Dockerfile"), dir)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected problems: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("CheckDockerfile accepted a broken Dockerfile")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("problems %q do not include %q", err, w)
				}
			}
		})
	}
}
