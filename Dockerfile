# syntax=docker/dockerfile:1
#
# idem-extproc and the quickstart's demo upstream, as static binaries on a
# distroless, non-root base. Build the server (the default, last stage),
# stamped with its version (idem-extproc version, the build_info metric):
#   docker build --build-arg VERSION=v0.1.0 --build-arg REVISION=$(git rev-parse HEAD) -t idem-extproc .
# for several platforms at once (the Go toolchain cross-compiles on the
# build machine's own platform, so no emulation is needed):
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=v0.1.0 -t idem-extproc .
# and the demo upstream:
#   docker build --target demo-orders -t idem-extproc-demo-orders .

# The release version and VCS revision, stamped into the binary and the
# image labels.
ARG VERSION=dev
ARG REVISION=unknown

# BUILDPLATFORM, TARGETOS and TARGETARCH are BuildKit's automatic platform
# ARGs (Dockerfile reference, "Automatic platform ARGs in the global scope"):
# global, so a stage must declare them to use them.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION
WORKDIR /src
COPY . .
# Static binaries: no libc on the final image. The cache mounts keep
# modules and build results between builds; go build fetches only the
# modules these two commands import (not the test-only ones).
# grpcnotrace leaves out grpc-go's golang.org/x/net/trace (grpc-go
# trace_notrace.go), whose html/template would make the linker keep every
# exported method: 36 % of the binary; nothing here serves its pages.
# GOWORK=off: the image builds the server's module alone, never the deploy
# tests' workspace (go.work, kept out of the context by .dockerignore).
ENV CGO_ENABLED=0 GOWORK=off
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -tags grpcnotrace \
      -ldflags="-s -w -X github.com/idem-extproc/idem-extproc/internal/version.version=${VERSION}" \
      -o /out/idem-extproc ./cmd/idem-extproc && \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags="-s -w" -o /out/demo-orders ./cmd/demo-orders

FROM gcr.io/distroless/static-debian12:nonroot AS demo-orders
COPY --from=build /out/demo-orders /usr/local/bin/demo-orders
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/demo-orders"]

FROM gcr.io/distroless/static-debian12:nonroot AS idem-extproc
ARG VERSION
ARG REVISION
# OCI image annotations (opencontainers/image-spec, annotations.md).
LABEL org.opencontainers.image.title="idem-extproc" \
      org.opencontainers.image.description="HTTP Idempotency-Key enforcement for Envoy through ext_proc" \
      org.opencontainers.image.source="https://github.com/idem-extproc/idem-extproc" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/idem-extproc /usr/local/bin/idem-extproc
USER nonroot:nonroot
# 50051: ext_proc and gRPC health; 8081: /healthz, /readyz and /metrics.
EXPOSE 50051 8081
# The image has no shell or curl: the binary probes itself, asking /readyz
# on 127.0.0.1 at the port of IDEM_ADMIN_LISTEN (8081 by default). An
# orchestrator with its own probes (Kubernetes) ignores this.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/usr/local/bin/idem-extproc", "probe"]
ENTRYPOINT ["/usr/local/bin/idem-extproc"]
