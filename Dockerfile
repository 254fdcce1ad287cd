# syntax=docker/dockerfile:1

FROM golang:1.26-bookworm AS build
# The revision that `xdsrelay version` and xdsrelay_build_info report (.git
# is not in the build context, so the build has no VCS data):
# --build-arg REVISION=$(git rev-parse HEAD). The version is the release the
# source is (cmd/xdsrelay/version.go); VERSION reports another instead
# (--build-arg VERSION=v1.2.3-rc.1).
ARG VERSION
ARG REVISION
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/xdsrelay ./cmd/xdsrelay

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/xdsrelay /xdsrelay
COPY config.example.yaml /etc/xdsrelay/config.yaml
COPY examples/resources /etc/xdsrelay/resources
# Serve the example resources by default; set XDSRELAY_UPSTREAM_ADDRESS=host:port
# to relay a control plane. The admin endpoint listens on all interfaces so
# that probes and scrapes reach it; there /readyz answers in general terms
# only (no group, address or file names). The read-only views are on
# 127.0.0.1:9902 inside the container (admin.local_address: docker exec or
# kubectl exec /xdsrelay config-dump --admin 127.0.0.1:9902 ..., or kubectl
# port-forward); set XDSRELAY_ADMIN_TLS_CERT_FILE, _KEY_FILE and
# _CLIENT_CA_FILE for everything over mTLS (docs/operations.md: Admin
# exposure).
ENV XDSRELAY_UPSTREAM_ADDRESS=file:///etc/xdsrelay/resources \
    XDSRELAY_ADMIN_ADDRESS=0.0.0.0:9901
EXPOSE 18001 9901
USER nonroot:nonroot
ENTRYPOINT ["/xdsrelay"]
CMD ["--config", "/etc/xdsrelay/config.yaml"]
