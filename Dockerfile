# syntax=docker/dockerfile:1
# Multi-stage build of keiro's two sidecars. Pick one with the target:
#   docker build --target relay    -t keiro-relay .
#   docker build --target consumer -t keiro-consumer .
# Both binaries are built once in the `build` stage; the runtime is debian-slim with curl for the
# compose healthchecks (GET /readyz) and CA certificates for Kafka/PostgreSQL TLS.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags="-s -w" -o /out/ ./cmd/relay ./cmd/consumer

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home keiro
USER 10001:10001

FROM runtime AS relay
COPY --from=build /out/relay /usr/local/bin/relay
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/relay"]

FROM runtime AS consumer
COPY --from=build /out/consumer /usr/local/bin/consumer
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/consumer"]
