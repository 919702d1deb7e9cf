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
-- It makes the load index (see acquire.lua) right for a least-connections pool and drops it for
-- any other strategy, whose scripts then have nothing to keep up. Where the index is kept
-- already, an entry still right (same allocation score, position and cost) stays as it is, with
-- the live count the other scripts keep in it: an instance starting with the pool's members
-- rewrites none. Else it is built from the live counts.
--
-- KEYS[1]  meta     HASH  rr = round-robin cursor, n = member count, load = "1" while the load
--                         index is kept
-- KEYS[2]  state    HASH  upstream -> "e|k|c|s|r" (see acquire.lua)
-- KEYS[3]  members  ZSET  eligible upstream -> allocation score
-- KEYS[4]  order    ZSET  upstream -> position in the configured list
-- KEYS[5]  leases   ZSET  lease id -> deadline (ms); pinned
-- KEYS[6]  lease_up HASH  lease id -> upstream; pinned
-- KEYS[7]  sessions ZSET  what versions before the session count kept per live session;
--                         nothing reads it now, so it is deleted
-- KEYS[8]  live     HASH  upstream -> live lease count
-- KEYS[9]  load     ZSET  the load index: "<allocs><pos><upstream>" -> listed live x cost
-- KEYS[10] load_of  HASH  upstream -> "<cost> <its entry in load>"
--
-- ARGV[1]    the pool's strategy: least-used | weighted | least-connections | round-robin
-- ARGV[2..]  the members, in configured order (distinct)
--
-- Returns  1 when the pool was new to this Redis (its state had been lost or never existed), else 0

local strategy = ARGV[1]
if #KEYS < 10 or (strategy ~= 'least-used' and strategy ~= 'weighted'
    and strategy ~= 'least-connections' and strategy ~= 'round-robin') then
  return redis.error_reply('ERR configure: bad arguments')
end
local want = {}
for i = 2, #ARGV do
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
local lc = strategy == 'least-connections'
local kept = lc and redis.call('HGET', KEYS[1], 'load') == '1'
if not kept then
  redis.call('DEL', KEYS[9], KEYS[10])
end
-- had: each indexed member's "<cost> <entry>" (left: entries of members no longer indexed).
local live_of, allocs_of, had = {}, {}, {}
if lc then
  local flat = redis.call('HGETALL', KEYS[8])
  for i = 1, #flat, 2 do live_of[flat[i]] = tonumber(flat[i + 1]) end
  flat = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
  for i = 1, #flat, 2 do allocs_of[flat[i]] = tonumber(flat[i + 1]) end
  if kept then
    flat = redis.call('HGETALL', KEYS[10])
    for i = 1, #flat, 2 do had[flat[i]] = flat[i + 1] end
  end
end
local scores, entries = {}, {}
local function flush()
  if #scores > 0 then
    redis.call('ZADD', KEYS[9], unpack(scores))
    redis.call('HSET', KEYS[10], unpack(entries))
    scores, entries = {}, {}
  end
end
for i = 2, #ARGV do
  local up = ARGV[i]
  local cur = redis.call('HGET', KEYS[2], up)
  if not cur then
    cur = '1|1|1|' .. string.format('%.0f', floor) .. '|0'
    redis.call('HSET', KEYS[2], up, cur)
    redis.call('ZADD', KEYS[3], floor, up)
    allocs_of[up] = floor
  end
  redis.call('ZADD', KEYS[4], i - 2, up)
  -- An eligible member's entry in the load index (the same entry as acquire.lua makes).
  local e, c = string.match(cur, '^(%d)|%d|(%d+)|')
  if lc and e == '1' then
    c = math.max(tonumber(c), 1)
    local entry = string.format('%017.0f%08d', allocs_of[up] or 0, i - 2) .. up
    local value = string.format('%d', c) .. ' ' .. entry
    local old = had[up]
    had[up] = nil
    if old ~= value then
      if old then
        redis.call('ZREM', KEYS[9], string.match(old, '^%d+ (.*)$'))
      end
      scores[#scores + 1] = string.format('%.0f', math.max(live_of[up] or 0, 0) * c)
      scores[#scores + 1] = entry
      entries[#entries + 1] = up
      entries[#entries + 1] = value
      if #scores >= 1000 then flush() end
    end
  end
end
flush()
-- Entries of members that left the pool or are not eligible.
for up, old in pairs(had) do
  redis.call('ZREM', KEYS[9], string.match(old, '^%d+ (.*)$'))
  redis.call('HDEL', KEYS[10], up)
end
if lc then
  redis.call('HSET', KEYS[1], 'load', '1')
else
  redis.call('HDEL', KEYS[1], 'load')
end
redis.call('HSET', KEYS[1], 'n', tostring(#ARGV - 1))
redis.call('HSETNX', KEYS[1], 'rr', '0')
local pin = '~ pins the hashtable/skiplist encoding: as a listpack every lease operation scans all leases'
redis.call('HSETNX', KEYS[6], '~', pin)
redis.call('ZADD', KEYS[5], 'NX', '+inf', pin)
if KEYS[7] then
  redis.call('DEL', KEYS[7])
end
return fresh and 1 or 0
