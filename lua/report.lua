-- report.lua: one gateway's unlisted leases of a pool (see acquire.lua), for everyone's counts.
--
-- A gateway sends the count of its unlisted leases per upstream once a second while it holds any,
-- and once more when it has none left. The report replaces the gateway's last one, so sending it
-- twice changes nothing, and it carries a deadline: the counts of a gateway that died stop counting
-- once it passes (`lease_ttl`, as a lease would). Reports past their deadline are removed here.
--
-- KEYS[1]  instances  ZSET  instance -> deadline (ms) of its report
-- KEYS[2]  held       HASH  instance -> its unlisted leases, "<count> <upstream>" lines
--
-- ARGV[1]  now (ms)   ARGV[2]  instance   ARGV[3]  deadline (ms, after now)
-- ARGV[4]  the lines ("" when it holds none: its report is removed)
-- ARGV[5]  events channel, or "" ; when given, "r" is published (a count dropped under a cap, so
--          requests waiting for capacity on any gateway try again)
--
-- Returns  the number of reports of dead gateways removed

local now = tonumber(ARGV[1])
local instance = ARGV[2]
local deadline_s = ARGV[3]
local deadline = tonumber(deadline_s)
local lines = ARGV[4]
local channel = ARGV[5]
if #KEYS < 2 or not now or not instance or instance == '' or not deadline or deadline <= now
    or not lines or not channel then
  return redis.error_reply('ERR report: bad arguments')
end

local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', '0', '1000')
if #dead > 0 then
  redis.call('HDEL', KEYS[2], unpack(dead))
  redis.call('ZREM', KEYS[1], unpack(dead))
end

if lines == '' then
  redis.call('HDEL', KEYS[2], instance)
  redis.call('ZREM', KEYS[1], instance)
else
  redis.call('HSET', KEYS[2], instance, lines)
  redis.call('ZADD', KEYS[1], deadline_s, instance)
end
if channel ~= '' then
  redis.call('PUBLISH', channel, 'r')
end
return #dead
