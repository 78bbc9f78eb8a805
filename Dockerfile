# syntax=docker/dockerfile:1
#
# Notify image: notify-api (the default command), notify-worker and notifyctl
# in /usr/local/bin, running as the non-root user 10001:10001.
#
#   docker build -t notify:0.1.0 .
#   docker run --rm -p 50051:50051 -p 9464:9464 \
#     -e NOTIFY_DATABASE__URL=mysql://notify:notify@mysql:3306 \
#     -e NOTIFY_RABBITMQ__URL=amqp://guest:guest@rabbitmq:5672/%2f \
#     -e NOTIFY_REDIS__URL=redis://redis:6379 notify:0.1.0
#   docker run --rm ... notify:0.1.0 notify-worker
#   docker run --rm ... notify:0.1.0 notifyctl migrate
#
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.

# The workspace needs Rust >= 1.94 (edition 2024); rust:1 is the latest stable.
# protoc comes from the protoc-bin-vendored crate: no protobuf-compiler needed.
ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
COPY . .
# The cargo registry and target/ live in BuildKit cache mounts, so a rebuild
# after a source change recompiles only the workspace crates, not every
# dependency. target/ is a cache mount, hence the copy out to /out.
RUN --mount=type=cache,id=notify-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=notify-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=notify-target,target=/src/target,sharing=locked \
    cargo build --release --bins --locked \
 && mkdir -p /out \
 && cp target/release/notify-api target/release/notify-worker target/release/notifyctl /out/

FROM ${RUNTIME_IMAGE} AS runtime
# ca-certificates: the CA bundle for any TLS client connection (unpinned on
# purpose: it should track Debian's security updates).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 notify \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin notify
# Image defaults: listen on every interface (the built-in defaults bind
# 127.0.0.1, unreachable from outside the container). A file rather than
# NOTIFY_*__LISTEN variables so that a mounted config (the Helm chart mounts
# its own /etc/notify/notify.toml) and NOTIFY_* variables both still win.
RUN mkdir -p /etc/notify \
 && printf '%s\n' \
      '# Notify image defaults; see services/core/default.toml for every setting.' \
      '[api]' \
      'listen = "0.0.0.0:50051"' \
      'metrics_listen = "0.0.0.0:9464"' \
      '' \
      '[worker]' \
      'metrics_listen = "0.0.0.0:9465"' \
      > /etc/notify/notify.toml
ENV NOTIFY_CONFIG=/etc/notify/notify.toml
COPY --from=builder /out/ /usr/local/bin/
USER 10001:10001
# 50051: notify-api gRPC; 9464: notify-api /metrics; 9465: notify-worker /metrics.
EXPOSE 50051 9464 9465
CMD ["notify-api"]
