# syntax=docker/dockerfile:1
# Build: docker build -t poolgate .
# Run:   docker run --rm -p 127.0.0.1:8080:8080 poolgate
#        (mount your own config at /etc/poolgate/gateway.toml; keep its listen on 0.0.0.0:8080)
# The shipped config has no client authentication: anyone who reaches the published port may use
# the proxy. Publish it on loopback as above, or configure [auth] before publishing it wider.
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
COPY gateway.toml /etc/poolgate/gateway.toml
# Inside a container the proxy must listen on all interfaces; the admin listener stays on
# loopback (exposing it requires server.admin_token). tests/cli.rs applies this very substitution
# to gateway.toml and checks the result.
RUN sed -i 's/^listen = "127.0.0.1:8080"/listen = "0.0.0.0:8080"/' /etc/poolgate/gateway.toml \
 && poolgate check --config /etc/poolgate/gateway.toml
USER poolgate
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/poolgate", "--config", "/etc/poolgate/gateway.toml"]
