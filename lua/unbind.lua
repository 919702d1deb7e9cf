-- unbind.lua: deletes a session binding if it still points at the given upstream.
--
-- KEYS[1]  sess      STRING  the session's upstream
-- KEYS[2]  sessions  ZSET    session key -> expiry (ms)
--
-- ARGV[1]  upstream    ARGV[2]  session key
--
-- Returns  1 when the binding was deleted, else 0

if #KEYS < 2 or not ARGV[1] or not ARGV[2] then
  return redis.error_reply('ERR unbind: bad arguments')
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 1
end
return 0
