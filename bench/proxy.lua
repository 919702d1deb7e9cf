-- wrk script for measuring an HTTP forward proxy: wrk connects to the proxy given as its URL and
-- sends absolute-form requests for the origin URL given after `--`:
--
--   wrk -t2 -c64 -d10s -s bench/proxy.lua http://127.0.0.1:PROXY/ -- http://127.0.0.1:ORIGIN/1k
--
-- At the end it prints one line, `wrk-result key=value ...`, that bench/run.sh reads.

function init(args)
   local target = args[1]
   if target == nil then
      error("usage: wrk ... -s proxy.lua http://PROXY/ -- http://ORIGIN/PATH")
   end
   local authority = target:match("^http://([^/]+)")
   if authority == nil then
      error("the origin URL must be http://host:port/path, got " .. target)
   end
   wrk.path = target
   wrk.headers["Host"] = authority
   -- An optional second argument asks for a kind of exit: the X-Pool-Labels header (issue #33).
   if args[2] ~= nil and args[2] ~= "" then
      wrk.headers["X-Pool-Labels"] = args[2]
   end
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "wrk-result requests=%d duration_us=%d p50_us=%d p99_us=%d connect_errors=%d read_errors=%d write_errors=%d timeouts=%d non2xx=%d\n",
      summary.requests, summary.duration,
      latency:percentile(50), latency:percentile(99),
      e.connect, e.read, e.write, e.timeout, e.status))
end
