# Scrapy through poolgate. Scrapy's HttpProxyMiddleware reads HTTP_PROXY/HTTPS_PROXY, so
#   HTTP_PROXY=http://127.0.0.1:8080 HTTPS_PROXY=http://127.0.0.1:8080 scrapy crawl myspider
# is all it takes. For a sticky session per spider (also for https:// pages), put the session in the
# proxy username, either in the environment:
#   HTTPS_PROXY=http://me-session-myspider1:x@127.0.0.1:8080
# or per request in the spider:
#
#   yield scrapy.Request(url, meta={"proxy": "http://me-session-myspider1:x@127.0.0.1:8080"})
#
# For plain-HTTP pages a header works too:
DEFAULT_REQUEST_HEADERS = {
    "X-Pool-Session": "myspider1",
}
# The gateway retries connect failures on other upstreams itself; keep Scrapy's retry for the rest.
RETRY_TIMES = 2
