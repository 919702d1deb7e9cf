-- release.lua: ends leases of a pool and adds exchange statistics, in one atomic step.
--
-- A gateway sends every release of a pool that queued while its previous call was under way in one
-- run (group commit), so the per-call cost is paid once per batch: the live counts drop once per
-- upstream. Statistics come summed per field over about a second, alone (n = 0) or with releases.
--
-- Releasing a lease that is already gone (it expired and was purged, or this is a replay after an
-- outage) frees nothing twice: the live count only drops for a lease still listed, and a lease id
-- given twice counts once. When the release takes an upstream off its cap, "r" is published so
-- that requests waiting for capacity on any gateway try again.
--
-- KEYS[1]  leases    ZSET  lease id -> deadline (ms)
-- KEYS[2]  lease_up  HASH  lease id -> upstream; a lease is listed while it has an entry here
--                          (grant, purge and release always write both keys)
-- KEYS[3]  live      HASH  upstream -> live lease count
-- KEYS[4]  stats     HASH  "<upstream>\n<outcome>" -> count, "<upstream>\nlatency_us" -> sum,
--                          "<upstream>\nlatency_n" -> count
--
-- ARGV[1]  cap: live leases per upstream (0 = none)
-- ARGV[2]  events channel
-- ARGV[3]  n, the number of leases (0: statistics only)
-- ARGV[4..3+n]  the lease ids
-- ARGV[4+n..]   pairs of a stats field and the amount to add to it: the caller sums outcomes per
--               field over about a second and sends them once, so this script builds no strings
--               and adds to each field once
--
-- Returns  1 when capacity was freed for waiting requests, else 0

local cap = tonumber(ARGV[1])
local channel = ARGV[2]
local n = tonumber(ARGV[3])
local first_stat = n and 4 + n
local stats = first_stat and #ARGV - first_stat + 1

-- Validate everything before the first write: Redis does not roll back a half-run script.
if #KEYS < 4 or not cap or not channel or not n or n < 0 or n ~= math.floor(n)
    or stats < 0 or stats % 2 ~= 0 then
  return redis.error_reply('ERR release: bad arguments')
end
local ids = {}
local seen = {}
for i = 4, 3 + n do
  local lease = ARGV[i]
  -- "~" is lease_up's encoding pin (see configure.lua), never a lease.
  if lease == '' or lease == '~' then
    return redis.error_reply('ERR release: bad arguments')
  end
  if not seen[lease] then
    seen[lease] = true
    ids[#ids + 1] = lease
  end
end
for i = first_stat + 1, #ARGV, 2 do
  if not string.match(ARGV[i], '^%d+$') or #ARGV[i] > 15 then
    return redis.error_reply('ERR release: bad arguments')
  end
end

-- Live counts drop for the leases still listed, once per upstream.
local ups = #ids > 0 and redis.call('HMGET', KEYS[2], unpack(ids)) or {}
local ended = {}
local drops = {}
local order = {}
for i = 1, #ids do
  local owner = ups[i]
  if owner then
    ended[#ended + 1] = ids[i]
    if not drops[owner] then
      drops[owner] = 0
      order[#order + 1] = owner
    end
    drops[owner] = drops[owner] + 1
  end
end
local freed = false
if #ended > 0 then
  redis.call('ZREM', KEYS[1], unpack(ended))
  redis.call('HDEL', KEYS[2], unpack(ended))
  for _, owner in ipairs(order) do
    local d = drops[owner]
    local after = redis.call('HINCRBY', KEYS[3], owner, d == 1 and '-1' or string.format('%d', -d))
    if after <= 0 then
      redis.call('HDEL', KEYS[3], owner)
    end
    if cap > 0 and after + d >= cap then
      freed = true
    end
  end
end

-- Statistics, summed per field by the caller.
for i = first_stat, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1])
end

if freed then
  redis.call('PUBLISH', channel, 'r')
  return 1
end
return 0
