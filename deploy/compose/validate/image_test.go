package validate_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/deploy/compose/validate"
)

const imageBuild = `FROM golang:1.26 AS build
COPY . .
RUN go build -o /out/ ./cmd/relay
`

const goodImage = imageBuild + `FROM scratch AS runtime
LABEL org.opencontainers.image.source="https://example.com/x" org.opencontainers.image.revision=abc
USER 10001:10001
FROM runtime AS relay
COPY --from=build /out/relay /usr/local/bin/relay
LABEL org.opencontainers.image.title="keiro relay"
ENV KEIRO_RELAY_HTTP_ADDR=0.0.0.0:9464
EXPOSE 9464
HEALTHCHECK --interval=10s CMD ["/usr/local/bin/relay", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/relay"]
`

func TestCheckDockerfileImages(t *testing.T) {
	cases := []struct {
		name, dockerfile string
		want             []string
	}{
		{"good", goodImage, nil},
		{"root, curl, no labels, loopback", imageBuild + `FROM debian:bookworm-slim AS relay
RUN apt-get install -y curl
COPY --from=build /out/relay /usr/local/bin/relay
ENV KEIRO_RELAY_HTTP_ADDR=127.0.0.1:9464
EXPOSE 8080
HEALTHCHECK CMD ["curl", "-f", "http://127.0.0.1:9464/readyz"]
ENTRYPOINT ["/usr/local/bin/relay"]
`, []string{
			`image "relay": runs as root`,
			`installs or runs curl`,
			`has no org.opencontainers.image.source label`,
			`has no org.opencontainers.image.title label`,
			`KEIRO_RELAY_HTTP_ADDR="127.0.0.1:9464" listens on loopback`,
			`EXPOSEs 8080, where nothing listens`,
			`HEALTHCHECK runs "curl", not the image's own binary`,
		}},
		{"user root by name", strings.Replace(goodImage, "USER 10001:10001", "USER root", 1), []string{`runs as root`}},
		{"no listen address", strings.Replace(goodImage, "ENV KEIRO_RELAY_HTTP_ADDR=0.0.0.0:9464\n", "", 1), []string{`does not set KEIRO_RELAY_HTTP_ADDR`}},
		{"exposes another port", strings.Replace(goodImage, "EXPOSE 9464", "EXPOSE 8080", 1), []string{`listens on port 9464 (KEIRO_RELAY_HTTP_ADDR) but EXPOSEs [8080]`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeTree(t, map[string]string{
				"go.mod":            "module example.com/x\n",
				"cmd/relay/main.go": "package main\n\nfunc main() {}\n",
				"Dockerfile":        c.dockerfile,
			})
			err := validate.CheckDockerfile(filepath.Join(dir, "Dockerfile"), dir)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected problems: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("CheckDockerfile accepted a broken image")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("problems %q do not include %q", err, w)
				}
			}
		})
	}
}

func TestCheckProjectServiceFitsImage(t *testing.T) {
	compose := `
services:
  relay:
    build: {context: ., target: relay}
    environment:
      KEIRO_RELAY_DATABASE_URL: postgres://x
      KEIRO_RELAY_BROKERS: k:9092
    ports: ["127.0.0.1:9464:9464"]
    healthcheck:
      test: ["CMD", "/usr/local/bin/relay", "healthcheck"]
  relay-curl:
    build: {context: ., target: relay}
    environment:
      KEIRO_RELAY_DATABASE_URL: postgres://x
      KEIRO_RELAY_BROKERS: k:9092
      KEIRO_RELAY_HTTP_ADDR: 0.0.0.0:8080
    ports: ["127.0.0.1:9000:9464"]
    healthcheck:
      test: ["CMD", "curl", "-f", "http://127.0.0.1:8080/readyz"]
  relay-shell:
    build: {context: ., target: relay}
    environment:
      KEIRO_RELAY_DATABASE_URL: postgres://x
      KEIRO_RELAY_BROKERS: k:9092
      KEIRO_RELAY_HTTP_ADDR: 127.0.0.1:9464
    ports: ["127.0.0.1:9001:9464"]
    healthcheck:
      test: ["CMD-SHELL", "relay healthcheck || exit 1"]
`
	dir := writeTree(t, map[string]string{
		"docker-compose.yml": compose,
		"go.mod":             "module example.com/x\n",
		"cmd/relay/main.go":  "package main\n\nfunc main() {}\n",
		"Dockerfile":         goodImage,
	})
	p, err := validate.LoadProject(context.Background(), filepath.Join(dir, "docker-compose.yml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = validate.CheckProject(p)
	if err == nil {
		t.Fatal("CheckProject accepted services that do not fit their image")
	}
	for _, want := range []string{
		`service "relay-curl": healthcheck runs [curl -f http://127.0.0.1:8080/readyz], but image "relay" only has /usr/local/bin/relay`,
		`service "relay-curl": publishes container port 9464, but relay listens on 0.0.0.0:8080`,
		`service "relay-shell": healthcheck runs a shell command, but image "relay" has no shell`,
		`service "relay-shell": publishes ports, but KEIRO_RELAY_HTTP_ADDR="127.0.0.1:9464" listens on loopback`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("problems do not include %q", want)
		}
	}
	if strings.Contains(err.Error(), `service "relay":`) {
		t.Errorf("the fitting service was reported: %v", err)
	}
}
