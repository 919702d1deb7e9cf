-- wrk script: absolute-form requests for N distinct target hosts through an HTTP forward proxy,
-- each request's host drawn at random among them (IP literals of 198.18.0.0/15, the range set
-- aside for benchmarks: bench/targets.sh's fake upstreams send every request to one loopback
-- origin and dial nothing else).
--
--   wrk -t2 -c32 -d10s -s bench/targets.lua http://127.0.0.1:PROXY/ -- N /1k
--
-- Run from the repository's root: the result line at the end, `wrk-result key=value ...`, is
-- bench/proxy.lua's `done`, which the bench scripts read.

dofile("bench/proxy.lua")

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
