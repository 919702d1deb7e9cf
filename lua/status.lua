-- status.lua: the live part of one pool's snapshot for /status: sessions, leases, reports.
--
-- The per-member hashes (state, allocation scores, statistics) grow with the pool and are read by
-- the caller with HSCAN/ZSCAN, a thousand fields a call: read here in one call, a pool of 100,000
-- members held Redis for seconds, every other gateway's acquire waiting behind it. What this
-- script reads grows with live leases only.
--
-- Live sessions are the `n` of the session count (see acquire.lua), after the seconds that have
-- passed are swept out: a binding counts until the end of the second its expiry falls in, so up
-- to BUCKET_MS after it expired, never less than its TTL.
--
-- KEYS[1]  leases    ZSET  lease id -> deadline (ms)
-- KEYS[2]  lease_up  HASH  lease id -> upstream
-- KEYS[3]  session_count HASH  expiry second -> bindings; n, swept (see acquire.lua)
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
-- Kept identical to acquire.lua's (a unit test compares them).
local BUCKET_MS = 1000
-- Past seconds a sweep drops one by one; after a longer idle time it reads the fields instead.
local SWEEP_SPAN = 1000

local function hdel_all(key, fields)
  for i = 1, #fields, 1000 do
    redis.call('HDEL', key, unpack(fields, i, math.min(i + 999, #fields)))
  end
end

-- Drops the fields of the seconds that have passed by `now` and takes their bindings off `n`;
-- returns the last second swept. Bounded: at most SWEEP_SPAN fields, or one read of the hash,
-- whose fields are at most the longest session TTL in seconds plus two.
local function sweep_counts(counts, now)
  local now_b = math.floor(now / BUCKET_MS)
  local swept = tonumber(redis.call('HGET', counts, 'swept'))
  if swept and swept >= now_b then return swept end
  local gone, past = 0, {}
  if swept and now_b - swept <= SWEEP_SPAN then
    for b = swept + 1, now_b do
      past[#past + 1] = string.format('%d', b)
    end
    for _, c in ipairs(redis.call('HMGET', counts, unpack(past))) do
      if c then gone = gone + tonumber(c) end
    end
  else
    local all = redis.call('HGETALL', counts)
    for i = 1, #all, 2 do
      local b = tonumber(all[i])
      if b and b <= now_b then
        past[#past + 1] = all[i]
        gone = gone + tonumber(all[i + 1])
      end
    end
  end
  hdel_all(counts, past)
  if gone > 0 then
    redis.call('HINCRBY', counts, 'n', string.format('%d', -gone))
  end
  redis.call('HSET', counts, 'swept', string.format('%d', now_b))
  return now_b
end

-- Strictly after now.
local after_now = '(' .. string.format('%.0f', now)
sweep_counts(KEYS[3], now)
local sessions = tonumber(redis.call('HGET', KEYS[3], 'n') or '0')
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
return {string.format('%d', sessions), live, reports}
