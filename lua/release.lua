-- release.lua: ends a lease and records the exchange's outcome.
--
-- Releasing a lease that is already gone (it expired and was purged, or this is a replay after an
-- outage) frees nothing twice: the live count only drops when the lease was still listed. When the
-- release takes an upstream off its cap, "r" is published so that requests waiting for capacity on
-- any gateway try again.
--
-- KEYS[1]  leases    ZSET  lease id -> deadline (ms)
-- KEYS[2]  lease_up  HASH  lease id -> upstream
-- KEYS[3]  live      HASH  upstream -> live lease count
-- KEYS[4]  stats     HASH  "<upstream>\n<outcome>" -> count, "<upstream>\nlatency_us" -> sum,
--                          "<upstream>\nlatency_n" -> count
--
-- ARGV[1]  lease id
-- ARGV[2]  upstream ("" when unknown: then nothing is recorded)
-- ARGV[3]  outcome key, e.g. "ok", "connect_error" ("" records nothing)
-- ARGV[4]  latency (microseconds)
-- ARGV[5]  cap: live leases per upstream (0 = none)
-- ARGV[6]  events channel
--
-- Returns  1 when capacity was freed for waiting requests, else 0

local lease = ARGV[1]
local upstream = ARGV[2]
local outcome = ARGV[3]
local latency = tonumber(ARGV[4])
local cap = tonumber(ARGV[5])
local channel = ARGV[6]

if #KEYS < 4 or not lease or lease == '' or not upstream or not outcome or not latency
    or latency < 0 or not cap or not channel then
  return redis.error_reply('ERR release: bad arguments')
end

local freed = false
if redis.call('ZREM', KEYS[1], lease) == 1 then
  local up = redis.call('HGET', KEYS[2], lease)
  redis.call('HDEL', KEYS[2], lease)
  if up then
    local before = tonumber(redis.call('HGET', KEYS[3], up) or '0') or 0
    if before <= 1 then
      redis.call('HDEL', KEYS[3], up)
    else
      redis.call('HINCRBY', KEYS[3], up, -1)
    end
    freed = cap > 0 and before >= cap
  end
end

if upstream ~= '' and outcome ~= '' then
  redis.call('HINCRBY', KEYS[4], upstream .. '\n' .. outcome, 1)
  redis.call('HINCRBY', KEYS[4], upstream .. '\nlatency_us', math.floor(latency))
  redis.call('HINCRBY', KEYS[4], upstream .. '\nlatency_n', 1)
end

if freed then
  redis.call('PUBLISH', channel, 'r')
  return 1
end
return 0
