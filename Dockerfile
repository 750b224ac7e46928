# syntax=docker/dockerfile:1
# Multi-stage build of keiro's two sidecars. Pick one with the target:
#   docker build --target relay    -t keiro-relay .
#   docker build --target consumer -t keiro-consumer .
# Both binaries are built once in the `build` stage. The runtime is an empty image (scratch) with
# the CA certificates (Kafka, PostgreSQL and OTLP over TLS) and an unprivileged user: no shell,
# no package manager, no curl. Healthchecks call the binary itself (`relay healthcheck`).
#
# Each image listens where it exposes: the relay on 0.0.0.0:9464, the consumer on 0.0.0.0:9465
# (/healthz, /readyz, /metrics), set through KEIRO_RELAY_HTTP_ADDR / KEIRO_CONSUMER_HTTP_ADDR.
# Outside a container both binaries default to loopback.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# `--version` and the telemetry's service.version come from these (docker build --build-arg
# VERSION=$(git describe) --build-arg REVISION=$(git rev-parse HEAD)).
ARG VERSION=dev
ARG REVISION=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags="-s -w -X github.com/keiro-go/keiro/cmd/internal/cli.version=${VERSION} -X github.com/keiro-go/keiro/cmd/internal/cli.commit=${REVISION}" \
      -o /out/ ./cmd/relay ./cmd/consumer
# The runtime's only files besides the binary: an unprivileged user and a writable /tmp.
RUN mkdir -p /rootfs/etc /rootfs/tmp \
 && chmod 1777 /rootfs/tmp \
 && echo 'keiro:x:10001:10001:keiro:/nonexistent:/sbin/nologin' > /rootfs/etc/passwd \
 && echo 'keiro:x:10001:' > /rootfs/etc/group

FROM scratch AS runtime
ARG VERSION=dev
ARG REVISION=unknown
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /rootfs/ /
LABEL org.opencontainers.image.vendor="keiro-go" \
      org.opencontainers.image.source="https://github.com/keiro-go/keiro" \
      org.opencontainers.image.documentation="https://github.com/keiro-go/keiro/blob/main/docs/operations.md" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
USER 10001:10001

FROM runtime AS relay
COPY --from=build /out/relay /usr/local/bin/relay
LABEL org.opencontainers.image.title="keiro-relay" \
      org.opencontainers.image.description="keiro outbox relay: publishes PostgreSQL outbox rows to Kafka"
ENV KEIRO_RELAY_HTTP_ADDR=0.0.0.0:9464
EXPOSE 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["/usr/local/bin/relay", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/relay"]

FROM runtime AS consumer
COPY --from=build /out/consumer /usr/local/bin/consumer
LABEL org.opencontainers.image.title="keiro-consumer" \
      org.opencontainers.image.description="keiro consumer: Kafka to a PostgreSQL inbox, exactly once per consumer"
ENV KEIRO_CONSUMER_HTTP_ADDR=0.0.0.0:9465
EXPOSE 9465
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["/usr/local/bin/consumer", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/consumer"]
