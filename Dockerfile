# Notify image: notify-api (the default command), notify-worker, notify-edge
# and notifyctl in /usr/local/bin, running as the non-root user 10001:10001
# on a read-only root file system (nothing is written outside mounted volumes).
#
#   docker build -t notify:0.1.0 .
#   docker run --rm --read-only -p 50051:50051 -p 9464:9464 \
#     -e NOTIFY_DATABASE__URL=mysql://notify:notify@mysql:3306 \
#     -e NOTIFY_RABBITMQ__URL=amqp://guest:guest@rabbitmq:5672/%2f \
#     -e NOTIFY_REDIS__URL=redis://redis:6379 \
#     -e NOTIFY_AUTH__INSECURE_ALLOW_UNAUTHENTICATED=true notify:0.1.0
#   docker run --rm ... notify:0.1.0 notify-worker
#   docker run --rm ... notify:0.1.0 notifyctl migrate
#
# The api listens on 0.0.0.0 here, so it refuses to start until auth is on
# (auth.enabled with [[auth.clients]]) or explicitly off as above.
#
# RUN --mount needs BuildKit, the default builder since Docker 23 (and
# buildah/podman understand it), so no `# syntax=` line is needed.
#
# Binaries already built (no Rust toolchain in the build): scripts/image
# with Dockerfile.prebuilt, see there.
#
# Debug info: the binaries are stripped of it (keeping the symbol table, so a
# panic's backtrace still names functions); the stripped-off DWARF files are
# the target `debug-symbols`:
#   docker build --target debug-symbols --output type=local,dest=out/ .

# The workspace needs Rust >= 1.94 (edition 2024); rust:1 is the latest stable.
# protoc comes from the protoc-bin-vendored crate: no protobuf-compiler needed.
ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
COPY . .
# The cargo registry and target/ live in BuildKit cache mounts, so a rebuild
# after a source change recompiles only the workspace crates, not every
# dependency. Only the shipped binaries' packages are built (not the
# benchmark or the test kit), as by scripts/run. target/ is a cache mount,
# hence the copy out to /out. The release profile keeps line tables (debug =
# "line-tables-only"); they move to /debug/<name>.debug, linked from the
# binary by --add-gnu-debuglink.
RUN --mount=type=cache,id=notify-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=notify-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=notify-target,target=/src/target,sharing=locked \
    cargo build --release --locked -p notify-api -p notify-worker -p notify-edge -p notifyctl \
 && mkdir -p /out /debug \
 && for bin in notify-api notify-worker notify-edge notifyctl; do \
      cp "target/release/$bin" /out/ \
      && objcopy --only-keep-debug "/out/$bin" "/debug/$bin.debug" \
      && strip --strip-debug "/out/$bin" \
      && objcopy --add-gnu-debuglink="/debug/$bin.debug" "/out/$bin" ; \
    done

# The debug info only: docker build --target debug-symbols --output ...
FROM scratch AS debug-symbols
COPY --from=builder /debug/ /

FROM ${RUNTIME_IMAGE} AS runtime
# ca-certificates: the CA bundle for TLS to MySQL, RabbitMQ and Redis when no
# CA file is configured (unpinned on purpose: it should track Debian's
# security updates).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 notify \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin notify
COPY image/notify.toml /etc/notify/notify.toml
ENV NOTIFY_CONFIG=/etc/notify/notify.toml
COPY --from=builder /out/ /usr/local/bin/
USER 10001:10001
# 50051: notify-api gRPC; 9464: notify-api /metrics, /healthz, /readyz;
# 9465: notify-worker /metrics, /healthz, /readyz; 8480: notify-edge, the
# users' REST and event stream; 9466: notify-edge /metrics, /healthz, /readyz.
EXPOSE 50051 9464 9465 8480 9466
CMD ["notify-api"]
