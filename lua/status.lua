-- status.lua: a read-only snapshot of one pool for /status.
--
-- KEYS[1]  state     HASH  upstream -> "e|k|c|s|r" (see acquire.lua)
-- KEYS[2]  members   ZSET  eligible upstream -> allocation score
-- KEYS[3]  leases    ZSET  lease id -> deadline (ms)
-- KEYS[4]  lease_up  HASH  lease id -> upstream
-- KEYS[5]  stats     HASH  "<upstream>\n<counter>" -> count
-- KEYS[6]  sessions  ZSET  session key -> expiry (ms)
--
-- ARGV[1]  now (ms)
--
-- Returns  {live sessions, state (flat field/value list), members (flat member/score list),
--           upstreams of the live leases (one entry per lease), stats (flat field/value list)}

local now = tonumber(ARGV[1])
if #KEYS < 6 or not now then
  return redis.error_reply('ERR status: bad arguments')
end
local sessions = redis.call('ZCOUNT', KEYS[6], '(' .. string.format('%.0f', now), '+inf')
-- '(+inf': not the encoding pin (see configure.lua).
local live_ids = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. string.format('%.0f', now), '(+inf')
local live = {}
if #live_ids > 0 then
  for _, up in ipairs(redis.call('HMGET', KEYS[4], unpack(live_ids))) do
    if up then
      live[#live + 1] = up
    end
  end
end
return {
  tostring(sessions),
  redis.call('HGETALL', KEYS[1]),
  redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES'),
  live,
  redis.call('HGETALL', KEYS[5]),
}
