-- configure.lua: declares a pool's membership, keeping the state of members that stay.
--
-- A joining member starts eligible at the current minimum allocation score, so least-used does
-- not flood it; a member that left loses its state (its live leases end or expire normally). The
-- round-robin cursor is kept: every gateway calls this at start (and after Redis lost its data),
-- and an instance starting must not send the pool's next requests back to its first members;
-- acquire.lua wraps a cursor past the end of a shrunk pool.
--
-- It also pins the encoding of the two lease keys. Every request adds a lease entry to each and
-- removes it again. Redis keeps a small HASH or ZSET (up to 128 entries) as a listpack, which it
-- scans entry by entry for each of those lookups and inserts: at 64 live leases, a third of its
-- work per request. One entry longer than 64 bytes (hash-max-listpack-value,
-- zset-max-listpack-value) makes the key a hash table / skip list for good, a restart included.
-- The pin is field "~" of lease_up and a member of leases with score +inf, so no deadline range
-- reaches it; lease ids are never "~".
--
-- KEYS[1]  meta     HASH  rr = round-robin cursor, n = member count
-- KEYS[2]  state    HASH  upstream -> "e|k|c|s|r" (see acquire.lua)
-- KEYS[3]  members  ZSET  eligible upstream -> allocation score
-- KEYS[4]  order    ZSET  upstream -> position in the configured list
-- KEYS[5]  leases   ZSET  lease id -> deadline (ms); pinned
-- KEYS[6]  lease_up HASH  lease id -> upstream; pinned
-- KEYS[7]  sessions ZSET  (optional) what versions before the session count kept per live
--                         session; nothing reads it now, so it is deleted
--
-- ARGV[1..]  the members, in configured order (distinct)
--
-- Returns  1 when the pool was new to this Redis (its state had been lost or never existed), else 0

if #KEYS < 6 then
  return redis.error_reply('ERR configure: bad arguments')
end
local want = {}
for i = 1, #ARGV do
  if ARGV[i] == '' or want[ARGV[i]] then
    return redis.error_reply('ERR configure: empty or duplicate member')
  end
  want[ARGV[i]] = true
end

local fresh = redis.call('EXISTS', KEYS[1]) == 0
local floor = 0
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if first[2] then
  floor = tonumber(first[2])
end

for _, up in ipairs(redis.call('HKEYS', KEYS[2])) do
  if not want[up] then
    redis.call('HDEL', KEYS[2], up)
    redis.call('ZREM', KEYS[3], up)
  end
end
redis.call('DEL', KEYS[4])
for i = 1, #ARGV do
  local up = ARGV[i]
  if not redis.call('HGET', KEYS[2], up) then
    redis.call('HSET', KEYS[2], up, '1|1|1|' .. string.format('%.0f', floor) .. '|0')
    redis.call('ZADD', KEYS[3], floor, up)
  end
  redis.call('ZADD', KEYS[4], i - 1, up)
end
redis.call('HSET', KEYS[1], 'n', tostring(#ARGV))
redis.call('HSETNX', KEYS[1], 'rr', '0')
local pin = '~ pins the hashtable/skiplist encoding: as a listpack every lease operation scans all leases'
redis.call('HSETNX', KEYS[6], '~', pin)
redis.call('ZADD', KEYS[5], 'NX', '+inf', pin)
if KEYS[7] then
  redis.call('DEL', KEYS[7])
end
return fresh and 1 or 0
