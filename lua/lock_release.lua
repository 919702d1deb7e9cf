-- lock_release.lua: releases a lock, only for its holder (compare-and-delete).
--
-- KEYS[1]  lock   STRING  the holder's token
--
-- ARGV[1]  token
--
-- Returns  1 when released, 0 when the lock is not held with this token (expired or taken over)

if #KEYS < 1 or not ARGV[1] or ARGV[1] == '' then
  return redis.error_reply('ERR lock_release: bad arguments')
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
