-- end_session.lua: deletes a session binding, whatever upstream it points at (an admin action).
--
-- KEYS[1]  sess      STRING  the session's upstream
-- KEYS[2]  sessions  ZSET    session key -> expiry (ms)
--
-- ARGV[1]  session key    ARGV[2]  now (ms)
--
-- Returns  1 when a live binding was deleted, else 0

if #KEYS < 2 or not ARGV[1] or not tonumber(ARGV[2]) then
  return redis.error_reply('ERR end_session: bad arguments')
end
local existed = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return existed
