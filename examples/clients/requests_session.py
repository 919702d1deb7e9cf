"""Python requests through poolgate, with a sticky session.

    pip install requests
    python examples/clients/requests_session.py
"""
import os

import requests

GATEWAY = os.environ.get("GATEWAY", "http://127.0.0.1:8080")

# 1. Unchanged code: only the environment points at the gateway.
os.environ.setdefault("HTTP_PROXY", GATEWAY)
os.environ.setdefault("HTTPS_PROXY", GATEWAY)
r = requests.get("http://example.com/", timeout=30)
print("plain:", r.status_code, r.headers.get("X-Pool-Upstream"))

# 2. A sticky session for plain HTTP: one header.
s = requests.Session()
s.headers["X-Pool-Session"] = "cart-7"
for _ in range(3):
    r = s.get("http://example.com/", timeout=30)
    print("header session:", r.headers.get("X-Pool-Upstream"))

# 3. A sticky session that also holds for HTTPS: the proxy username carries it.
host = GATEWAY.split("://", 1)[1]
sticky = f"http://me-session-cart7:x@{host}"
for _ in range(3):
    r = requests.get("https://example.com/", proxies={"http": sticky, "https": sticky}, timeout=30)
    print("username session:", r.status_code)
