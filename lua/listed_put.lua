-- listed_put.lua: publishes the members a pool's upstream lists contribute, as decided by the
-- instance holding the pool's sources lock, so every instance declares the same membership.
--
-- KEYS[1]  listed  STRING  one upstream URL a line (credentials included: the URLs the
--                          instances connect with)
--
-- ARGV[1]  the list (may be empty)
-- ARGV[2]  the pool's events channel
-- ARGV[3]  the publishing instance's id
--
-- Returns  1 when the list changed (and `l\n<instance>` was published on the channel), 0 when
--          it was already the same

if #KEYS < 1 or not ARGV[1] or not ARGV[2] or ARGV[2] == '' or not ARGV[3] or ARGV[3] == '' then
  return redis.error_reply('ERR listed_put: bad arguments')
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'l\n' .. ARGV[3])
return 1
