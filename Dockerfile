# syntax=docker/dockerfile:1
# Build: docker build -t poolgate .
# Run:   docker run --rm -p 8080:8080 poolgate
#        (mount your own config at /etc/poolgate/gateway.toml; keep its listen on 0.0.0.0:8080)

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
# loopback (exposing it requires server.admin_token).
RUN sed -i 's/^listen = "127.0.0.1:8080"/listen = "0.0.0.0:8080"/' /etc/poolgate/gateway.toml \
 && poolgate check --config /etc/poolgate/gateway.toml
USER poolgate
EXPOSE 8080 8081
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/poolgate", "--config", "/etc/poolgate/gateway.toml"]
