-- lock_acquire.lua: takes a job lock if nobody holds it (SET NX PX).
--
-- KEYS[1]  lock   STRING  the holder's random token, PX = the lock's TTL
--
-- ARGV[1]  token (random, unique per acquisition)    ARGV[2]  TTL (ms)
--
-- Returns  1 when the lock was taken, 0 when someone holds it

local ttl = tonumber(ARGV[2])
if #KEYS < 1 or not ARGV[1] or ARGV[1] == '' or not ttl or ttl <= 0 then
  return redis.error_reply('ERR lock_acquire: bad arguments')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl) then
  return 1
end
return 0
