-- status.lua: the live part of one pool's snapshot for /status: sessions, leases, reports.
--
-- The per-member hashes (state, allocation scores, statistics) grow with the pool and are read by
-- the caller with HSCAN/ZSCAN, a thousand fields a call: read here in one call, a pool of 100,000
-- members held Redis for seconds, every other gateway's acquire waiting behind it. What this
-- script reads grows with live sessions (counted, not read) and live leases only.
--
-- KEYS[1]  leases    ZSET  lease id -> deadline (ms)
-- KEYS[2]  lease_up  HASH  lease id -> upstream
-- KEYS[3]  sessions  ZSET  session key -> expiry (ms)
-- KEYS[4]  instances ZSET  instance -> deadline (ms) of its report (see report.lua)
-- KEYS[5]  held      HASH  instance -> its unlisted leases, "<count> <upstream>" lines
--
-- ARGV[1]  now (ms)   ARGV[2]  the asking instance (its own unlisted leases it counts itself)
--
-- Returns  {live sessions, upstreams of the live leases (one entry per lease),
--           the live reports of other instances' unlisted leases (their lines)}

local now = tonumber(ARGV[1])
local me = ARGV[2]
if #KEYS < 5 or not now or not me then
  return redis.error_reply('ERR status: bad arguments')
end
-- Strictly after now.
local after_now = '(' .. string.format('%.0f', now)
local sessions = redis.call('ZCOUNT', KEYS[3], after_now, '+inf')
-- '(+inf': not the encoding pin (see configure.lua).
local live_ids = redis.call('ZRANGEBYSCORE', KEYS[1], after_now, '(+inf')
local live = {}
if #live_ids > 0 then
  for _, up in ipairs(redis.call('HMGET', KEYS[2], unpack(live_ids))) do
    if up then
      live[#live + 1] = up
    end
  end
end
local reports = {}
local alive = redis.call('ZRANGEBYSCORE', KEYS[4], after_now, '+inf')
for _, instance in ipairs(alive) do
  local lines = instance ~= me and redis.call('HGET', KEYS[5], instance)
  if lines then
    reports[#reports + 1] = lines
  end
end
return {tostring(sessions), live, reports}
