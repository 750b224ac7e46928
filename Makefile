# keiro-go — `make help` lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
export DATABASE_URL
KEIRO_TEST_DATABASE_URL ?= $(DATABASE_URL)
export KEIRO_TEST_DATABASE_URL

# Packages whose concurrency matters run under the race detector in `make test`.
RACE_PKGS := ./outbox/... ./inbox/... ./events/... ./migrations/...
# Short fuzz runs are bounded by executions, not wall-clock time: with a duration, Go 1.26's fuzz
# coordinator can report "context deadline exceeded" at the deadline on a loaded machine although
# no input failed (Go issue 75804, fixed in Go 1.27). A count has no deadline to race.
FUZZTIME ?= 50000x

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: postgres
postgres: ## Make sure the local PostgreSQL answers on 127.0.0.1:5432 (installs, configures and starts it: scripts/postgres).
	@if [ "$(DATABASE_URL)" = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" ]; then bash scripts/postgres; fi

.PHONY: demo
demo: postgres ## Run the end-to-end demo (embedded Kafka, local PostgreSQL at DATABASE_URL). N=orders.
	$(GO) run ./cmd/demo $(if $(N),-n $(N)) $(DEMO_FLAGS)

# Stamped into the binaries (`relay --version`); without them the Go build info is used.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X github.com/keiro-go/keiro/cmd/internal/cli.version=$(VERSION) -X github.com/keiro-go/keiro/cmd/internal/cli.commit=$(COMMIT)

.PHONY: build
build: ## Build every package and the binaries into ./bin (VERSION and COMMIT stamped).
	$(GO) build ./...
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/relay ./cmd/consumer

.PHONY: test
test: vet postgres ## Run the whole test suite (PostgreSQL started; a real Kafka broker and a real schema registry (Apicurio) from Maven, kfake and srfake; a real Kubernetes API server for the manifests; short fuzz runs; the adversarial suite with a few generated cases per boundary; race detector on the storage packages).
	$(MAKE) --no-print-directory lint
	$(GO) run ./keirotest/testenv/kafkabroker/cmd/kafkabroker classpath
	$(GO) run ./keirotest/testenv/internal/apicurio/cmd/apicurio fetch
	$(MAKE) --no-print-directory alerts-check
	$(MAKE) --no-print-directory deploy-check
	$(MAKE) --no-print-directory qa-modules-test
	$(MAKE) --no-print-directory fuzz-short
	$(GO) test -count=1 -timeout 20m -race $(RACE_PKGS)
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v -E '/(outbox|inbox|events|migrations)(/|$$)')

# Modules of their own whose dependencies stay out of the main go.mod: the compose validation
# (compose-go, BuildKit's Dockerfile parser) and the console's browser test (chromedp).
QA_MODULES := deploy/compose/validate console/browsertest

.PHONY: vet
vet: ## gofmt check and go vet (the peers harness and the QA modules, modules of their own, are vetted too, so they keep building).
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	@set -e; for m in $(QA_MODULES); do echo "vet $$m"; (cd $$m && $(GO) vet ./...); done

# golangci-lint at the version tools/go.mod pins (a module of its own, so that its dependencies
# stay out of go.mod), built into bin/; its analysis cache lives in ~/.cache/golangci-lint.
GOLANGCI_LINT := bin/golangci-lint

.PHONY: lint
lint: ## Run golangci-lint with .golangci.yml (staticcheck, errorlint, depguard keeping the test kit out of production code); make test runs it.
	$(GO) build -C tools -o $(CURDIR)/$(GOLANGCI_LINT) github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	$(GOLANGCI_LINT) run ./...

.PHONY: qa-modules-test
qa-modules-test: ## Test the QA modules (compose validation and stack run, the console in Chromium); make test runs it.
	@set -e; for m in $(QA_MODULES); do echo "test $$m"; (cd $$m && $(GO) test -count=1 -timeout 20m ./...); done

.PHONY: kafka
kafka: ## Run a real Apache Kafka broker on loopback for the tests (BROKERS=3 for a cluster); prints KEIRO_TEST_KAFKA_BROKERS.
	$(GO) run ./keirotest/testenv/kafkabroker/cmd/kafkabroker run -brokers $${BROKERS:-1}

.PHONY: schema-registry
schema-registry: ## Run a real schema registry (Apicurio Registry, Confluent API) on loopback for the tests; prints KEIRO_TEST_SCHEMA_REGISTRY_URL.
	$(GO) run ./keirotest/testenv/internal/apicurio/cmd/apicurio run

.PHONY: trace-backend
trace-backend: ## Run a real trace backend (Jaeger v2, built once per machine) on loopback for the tests; prints KEIRO_TEST_TRACE_BACKEND.
	$(GO) run ./keirotest/testenv/internal/jaeger/cmd/jaeger run

.PHONY: fuzz-short
fuzz-short: ## Run every fuzz target of the main module briefly (FUZZTIME each: 50000x executions by default, or a duration such as 5m).
	@set -e; for spec in $$(grep -rl --include='*_test.go' --exclude-dir=bench '^func Fuzz' . | xargs grep -h -o '^func Fuzz[A-Za-z0-9_]*' /dev/null | sort -u | sed 's/func //'); do \
	  pkg=$$(grep -rl --include='*_test.go' --exclude-dir=bench "^func $$spec(" . | head -1 | xargs dirname); \
	  echo "fuzz $$pkg $$spec"; \
	  $(GO) test -run='^$$' -fuzz="^$$spec$$" -fuzztime=$(FUZZTIME) $$pkg; \
	done

# make fuzz: the adversarial suite (e2e/adversarial_*_test.go) with many generated cases per
# boundary, then every fuzz target for longer than make test does. A count, not a duration, for
# the reason given at FUZZTIME.
ADVERSARIAL_N ?= 500
FUZZTIME_LONG ?= 2000000x

.PHONY: fuzz
fuzz: postgres ## Run the adversarial suite with ADVERSARIAL_N generated bad inputs per boundary (default 500; ADVERSARIAL_SEED=n replays a run), then every fuzz target for FUZZTIME_LONG (default 2000000x executions).
	KEIRO_ADVERSARIAL_N=$(ADVERSARIAL_N) $(if $(ADVERSARIAL_SEED),KEIRO_ADVERSARIAL_SEED=$(ADVERSARIAL_SEED)) \
	  $(GO) test -count=1 -timeout 60m -run '^TestAdversarial' ./e2e/
	$(MAKE) --no-print-directory fuzz-short FUZZTIME=$(FUZZTIME_LONG)

.PHONY: bench
bench: ## Run the benchmarks recorded in BENCHMARKS.md.
	$(GO) test -run='^$$' -bench=. -benchmem -count=1 -timeout 60m ./envelope/ ./schema/ ./outbox/ ./inbox/ ./inbox/handlers/ ./events/ ./tracing/ ./cmd/relay/

.PHONY: bench-peers
bench-peers: ## Run keiro's relay and consumer side by side with Watermill and a SKIP LOCKED loop (bench/, PEERS_FLAGS).
	cd bench && $(GO) run ./cmd/peers $(PEERS_FLAGS)

.PHONY: chaos
chaos: ## Run the chaos test for longer than CI does (CHAOS_DURATION, default 5m), with its deep-backlog phase.
	KEIRO_CHAOS_DEEP=1 KEIRO_CHAOS_DURATION=$${CHAOS_DURATION:-5m} $(GO) test -count=1 -timeout 60m -run Chaos -v ./e2e/

.PHONY: alerts-check
alerts-check: ## Check and unit-test the Prometheus alert rules with promtool (Debian package prometheus).
	@command -v promtool >/dev/null 2>&1 || { echo "promtool not found: install Debian's prometheus package (.ci/run does)" >&2; exit 1; }
	promtool check rules deploy/prometheus/alerts.yml
	promtool test rules deploy/prometheus/alerts_test.yml

.PHONY: deploy-check
deploy-check: ## Decode every Kubernetes manifest strictly into the API types, then submit every object to a real kube-apiserver (etcd, server-side dry run, strict fields; the server is built once per machine) (separate module).
	cd deploy/kubernetes/validate && $(GO) vet ./... && $(GO) run ./internal/apiserver/cmd/build >/dev/null && $(GO) test -count=1 -timeout 15m ./...

.PHONY: compose-check
compose-check: ## Validate docker-compose.yml and the Dockerfile, and run its relay and consumer on a real Kafka (no engine needed; a module of its own).
	cd deploy/compose/validate && $(GO) test -count=1 ./...

.PHONY: compose-test
compose-test: ## Run docker-compose.yml, unchanged, on images built here without a pull, and check the pipeline through its containers (installs and starts a Docker engine: scripts/docker; docs/compose.md).
	eval "$$(bash scripts/docker)" && bash deploy/compose/local/build-images && \
	  cd deploy/compose/validate && $(GO) test -tags composetest -count=1 -timeout 30m -run '^TestComposeUp$$' -v ./...

.PHONY: clean
clean: ## Remove build output.
	rm -rf bin/
