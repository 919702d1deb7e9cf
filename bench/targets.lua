-- wrk script: absolute-form requests for N distinct target hosts through an HTTP forward proxy,
-- each request's host drawn at random among them (IP literals of 198.18.0.0/15, the range set
-- aside for benchmarks: bench/targets.sh's fake upstreams send every request to one loopback
-- origin and dial nothing else).
--
--   wrk -t2 -c32 -d10s -s bench/targets.lua http://127.0.0.1:PROXY/ -- N /1k
--
-- At the end it prints one line, `wrk-result key=value ...`, as bench/proxy.lua does.

local n, path = 1, "/1k"

function init(args)
   n = tonumber(args[1])
   if n == nil or n < 1 or n > 131072 then
      error("usage: wrk ... -s targets.lua http://PROXY/ -- N [PATH] (N from 1 to 131072)")
   end
   path = args[2] or path
   math.randomseed(os.time() + math.floor(os.clock() * 1e6))
end

function request()
   local i = math.random(n) - 1
   local host = string.format("198.%d.%d.%d", 18 + math.floor(i / 65536), math.floor(i / 256) % 256, i % 256)
   return wrk.format("GET", "http://" .. host .. path, { Host = host })
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "wrk-result requests=%d duration_us=%d p50_us=%d p99_us=%d connect_errors=%d read_errors=%d write_errors=%d timeouts=%d non2xx=%d\n",
      summary.requests, summary.duration,
      latency:percentile(50), latency:percentile(99),
      e.connect, e.read, e.write, e.timeout, e.status))
end
