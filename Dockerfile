# syntax=docker/dockerfile:1
#
# idem-extproc and the quickstart's demo upstream, as static binaries on a
# distroless, non-root base. Build the server (the default, last stage):
#   docker build -t idem-extproc .
# and the demo upstream:
#   docker build --target demo-orders -t idem-extproc-demo-orders .
#
# No HEALTHCHECK: the image has no shell or curl to run one, and the
# orchestrator probes the admin port instead (/healthz for liveness,
# /readyz for readiness, on :8081), or gRPC health on :50051.

FROM golang:1.26 AS build
WORKDIR /src
COPY . .
# Static binaries: no libc on the final image. The cache mounts keep
# modules and build results between builds; go build fetches only the
# modules these two commands import (not the test-only ones).
ENV CGO_ENABLED=0
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/idem-extproc ./cmd/idem-extproc && \
    go build -trimpath -ldflags="-s -w" -o /out/demo-orders ./cmd/demo-orders

FROM gcr.io/distroless/static-debian12:nonroot AS demo-orders
COPY --from=build /out/demo-orders /usr/local/bin/demo-orders
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/demo-orders"]

FROM gcr.io/distroless/static-debian12:nonroot AS idem-extproc
COPY --from=build /out/idem-extproc /usr/local/bin/idem-extproc
USER nonroot:nonroot
# 50051: ext_proc and gRPC health; 8081: /healthz and /readyz.
EXPOSE 50051 8081
ENTRYPOINT ["/usr/local/bin/idem-extproc"]
