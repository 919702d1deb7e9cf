-- lock_extend.lua: pushes a held lock's expiry out, only for its holder (compare-and-PEXPIRE).
--
-- KEYS[1]  lock   STRING  the holder's token
--
-- ARGV[1]  token    ARGV[2]  new TTL (ms)
--
-- Returns  1 when extended, 0 when the lock is not held with this token (expired or taken over)

local ttl = tonumber(ARGV[2])
if #KEYS < 1 or not ARGV[1] or ARGV[1] == '' or not ttl or ttl <= 0 then
  return redis.error_reply('ERR lock_extend: bad arguments')
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
return 0
