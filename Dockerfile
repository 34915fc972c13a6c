# syntax=docker/dockerfile:1
#
# rtproxy image: one static binary on distroless, running as uid 65532.
# Build:  docker build --build-arg VERSION=$(git describe --tags --always) -t rtproxy .
#
# deploy/scripts/image-check.sh reads this file: it runs the `go build` line
# below on the host and checks that the result is static, and compares the
# user, paths and ports here with the Helm chart. Keep them in step.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/rtproxy ./cmd/rtproxy
# Directories the runtime image needs, owned by the non-root user: distroless
# has no shell to create them there.
RUN mkdir -p /out/etc/rtproxy/rules /out/var/lib/rtproxy

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="rtproxy" \
      org.opencontainers.image.description="Kafka-protocol proxy with real-time pipelines" \
      org.opencontainers.image.source="https://github.com/rtproxy/rtproxy" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/rtproxy /usr/local/bin/rtproxy
COPY --from=build --chown=65532:65532 /out/etc/rtproxy/rules /etc/rtproxy/rules
COPY --from=build --chown=65532:65532 /out/var/lib/rtproxy /var/lib/rtproxy
# A config for `docker run`: the same ports and paths the chart renders.
COPY deploy/docker/rtproxy.yaml /etc/rtproxy/rtproxy.yaml
USER 65532:65532
# Checkpoints and operator state. Everything else can be read-only.
VOLUME ["/var/lib/rtproxy"]
# bootstrap, per-broker listeners (broker_ports .. +broker_port_count-1), admin
EXPOSE 9092 9093-9192 9644
ENTRYPOINT ["/usr/local/bin/rtproxy"]
CMD ["run", "--config", "/etc/rtproxy/rtproxy.yaml"]
