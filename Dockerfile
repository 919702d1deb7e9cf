# syntax=docker/dockerfile:1
# Build: docker build -t poolgate .
# Run:   docker run --rm -p 127.0.0.1:8080:8080 poolgate
#        (mount your own config at /etc/poolgate/gateway.toml; keep its listen on 0.0.0.0:8080)
# The image's config has no users: only clients from loopback and the private ranges may use the
# proxy (auth.client_cidrs). Configure [auth.users] before publishing it to anyone else.
# The admin listener stays on loopback inside the container, so it is not exposed; to reach it,
# mount a config with admin_listen = "0.0.0.0:8081" and an admin_token, and publish 8081.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY lua ./lua
COPY examples ./examples
RUN cargo build --release --locked --bin poolgate

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin poolgate
COPY --from=build /src/target/release/poolgate /usr/local/bin/poolgate
# The image's own config (docker/gateway.toml): the proxy on all interfaces inside the container,
# usable without credentials only from loopback and the private ranges (auth.client_cidrs), the
# admin listener on loopback. tests/cli.rs loads this file and checks EXPOSE against it.
COPY docker/gateway.toml /etc/poolgate/gateway.toml
RUN poolgate check --config /etc/poolgate/gateway.toml
USER poolgate
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/poolgate", "--config", "/etc/poolgate/gateway.toml"]
