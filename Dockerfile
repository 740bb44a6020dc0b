# syntax=docker/dockerfile:1
# The outbox-poll image: the release binary on a small runtime image (glibc,
# CA certificates, a non-root user), the migrations beside it.
#   docker build -t outbox-poll .
#   docker run --rm -e DATABASE_URL -e AMQP_URL outbox-poll --drain
# The entrypoint is the binary, so arguments are outbox-poll's own
# (`... outbox-poll migrate`, `... outbox-poll status --json`).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The caches keep the crates and the dependencies' build between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin outbox-poll \
    && install -D -m 0755 target/release/outbox-poll /out/outbox-poll \
    && strip --strip-unneeded /out/outbox-poll

# Distroless cc: glibc and libgcc (which the binary links), CA certificates
# (for amqps:// and sslrootcert=system), no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/outbox-poll /usr/bin/outbox-poll
COPY migrations/ /usr/share/outbox-poll/migrations/
# The nonroot user of distroless (65532), by number, so that Kubernetes'
# runAsNonRoot can check it.
USER 65532:65532
ENTRYPOINT ["/usr/bin/outbox-poll"]
