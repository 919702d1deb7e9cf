-- status.lua: a read-only snapshot of one pool for /status.
--
-- KEYS[1]  state     HASH  upstream -> "e|k|c|s|r" (see acquire.lua)
-- KEYS[2]  members   ZSET  eligible upstream -> allocation score
-- KEYS[3]  leases    ZSET  lease id -> deadline (ms)
-- KEYS[4]  lease_up  HASH  lease id -> upstream
-- KEYS[5]  stats     HASH  "<upstream>\n<counter>" -> count
-- KEYS[6]  sessions  ZSET  session key -> expiry (ms)
-- KEYS[7]  instances ZSET  instance -> deadline (ms) of its report (see report.lua)
-- KEYS[8]  held      HASH  instance -> its unlisted leases, "<count> <upstream>" lines
--
-- ARGV[1]  now (ms)   ARGV[2]  the asking instance (its own unlisted leases it counts itself)
--
-- Returns  {live sessions, state (flat field/value list), members (flat member/score list),
--           upstreams of the live leases (one entry per lease), stats (flat field/value list),
--           the live reports of other instances' unlisted leases (their lines)}

local now = tonumber(ARGV[1])
local me = ARGV[2]
if #KEYS < 8 or not now or not me then
  return redis.error_reply('ERR status: bad arguments')
end
-- Strictly after now.
local after_now = '(' .. string.format('%.0f', now)
local sessions = redis.call('ZCOUNT', KEYS[6], after_now, '+inf')
-- '(+inf': not the encoding pin (see configure.lua).
local live_ids = redis.call('ZRANGEBYSCORE', KEYS[3], after_now, '(+inf')
local live = {}
if #live_ids > 0 then
  for _, up in ipairs(redis.call('HMGET', KEYS[4], unpack(live_ids))) do
    if up then
      live[#live + 1] = up
    end
  end
end
local reports = {}
local alive = redis.call('ZRANGEBYSCORE', KEYS[7], after_now, '+inf')
for _, instance in ipairs(alive) do
  local lines = instance ~= me and redis.call('HGET', KEYS[8], instance)
  if lines then
    reports[#reports + 1] = lines
  end
end
return {
  tostring(sessions),
  redis.call('HGETALL', KEYS[1]),
  redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES'),
  live,
  redis.call('HGETALL', KEYS[5]),
  reports,
}
