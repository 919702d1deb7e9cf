#!/usr/bin/env sh
# curl through poolgate. GATEWAY defaults to the example config's proxy port.
GATEWAY=${GATEWAY:-http://127.0.0.1:8080}

# Any upstream of the default pool; the response says which one in X-Pool-Upstream.
curl -sS -x "$GATEWAY" -D - -o /dev/null http://example.com/

# The standard environment variables, exactly as an unchanged scraper would use them.
http_proxy=$GATEWAY https_proxy=$GATEWAY curl -sS -o /dev/null -w '%{http_code}\n' https://example.com/

# A sticky session by header (plain HTTP) ...
curl -sS -x "$GATEWAY" -H 'X-Pool-Session: basket-42' -D - -o /dev/null http://example.com/
# ... and by proxy username, which also works for HTTPS (the CONNECT carries it).
curl -sS -x "$GATEWAY" -U 'me-session-basket42:x' -D - -o /dev/null https://example.com/

# Let the gateway mint a key, returned in X-Pool-Session.
curl -sS -x "$GATEWAY" -H 'X-Pool-Session: create' -D - -o /dev/null http://example.com/

# Another pool, by header or username token.
curl -sS -x "$GATEWAY" -H 'X-Pool-Name: residential' -o /dev/null -w '%{http_code}\n' http://example.com/
