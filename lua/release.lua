-- release.lua: ends leases of a pool and adds exchange statistics, in one atomic step.
--
-- A gateway sends every release of a pool that queued while its previous call was under way in one
-- run (group commit), so the per-call cost is paid once per batch: the live counts drop once per
-- upstream. Statistics come summed per field over about a second, alone (n = 0) or with releases.
--
-- Releasing a lease that is already gone (it expired and was purged, or this is a replay after an
-- outage) frees nothing twice: the live count only drops for a lease still listed, and a lease id
-- given twice counts once. When the release takes an upstream off its cap, "r" is published so
-- that requests waiting for capacity on any gateway try again. "At its cap" is judged as
-- acquire.lua judges it: the listed leases plus the unlisted ones other gateways report (KEYS[5],
-- KEYS[6]), so that a release right after a reload added a cap (when older leases are still
-- unlisted) wakes the requests that acquire.lua made wait.
--
-- KEYS[1]  leases    ZSET  lease id -> deadline (ms)
-- KEYS[2]  lease_up  HASH  lease id -> upstream; a lease is listed while it has an entry here
--                          (grant, purge and release always write both keys)
-- KEYS[3]  live      HASH  upstream -> live lease count
-- KEYS[4]  stats     HASH  "<upstream>\n<outcome>" -> count, "<upstream>\nlatency_us" -> sum,
--                          "<upstream>\nlatency_n" -> count
-- KEYS[5]  instances ZSET  instance -> deadline (ms) of its report (see report.lua); read with a cap
-- KEYS[6]  held      HASH  instance -> its unlisted leases, "<count> <upstream>" lines; read with a cap
-- KEYS[7]  load      ZSET  the load index of least-connections (see acquire.lua): a member's
--                          entry there moves with its live count
-- KEYS[8]  load_of   HASH  upstream -> "<cost> <its entry in load>"
--
-- ARGV[1]  cap: live leases per upstream (0 = none)
-- ARGV[2]  events channel
-- ARGV[3]  n, the number of leases (0: statistics only)
-- ARGV[4..3+n]  the lease ids
-- ARGV[4+n..]   pairs of a stats field and the amount to add to it: the caller sums outcomes per
--               field over about a second and sends them once, so this script builds no strings
--               and adds to each field once; then, when the cap is set, now (ms) as the last
--               argument (the reports of gateways whose deadline passed are not counted)
--
-- Returns  1 when capacity was freed for waiting requests, else 0

local cap = tonumber(ARGV[1])
local channel = ARGV[2]
local n = tonumber(ARGV[3])
local first_stat = n and 4 + n
-- With a cap, the last argument is the time (and KEYS[5], KEYS[6] hold the reports).
local now = cap and cap > 0 and tonumber(ARGV[#ARGV])
local last_stat = (cap and cap > 0) and #ARGV - 1 or #ARGV
local stats = first_stat and last_stat - first_stat + 1

-- Validate everything before the first write: Redis does not roll back a half-run script.
if #KEYS < 8 or not cap or not channel or not n or n < 0 or n ~= math.floor(n)
    or stats < 0 or stats % 2 ~= 0 or (cap > 0 and not now) then
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
for i = first_stat + 1, last_stat, 2 do
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
-- Unlisted leases other gateways reported for `up` (read once, when first needed).
local reported
local function held(up)
  if not reported then
    reported = {}
    local alive = redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. string.format('%d', now), '+inf')
    if #alive > 0 then
      for _, lines in ipairs(redis.call('HMGET', KEYS[6], unpack(alive))) do
        if lines then
          for count, u in string.gmatch(lines, '(%d+) ([^\n]+)') do
            reported[u] = (reported[u] or 0) + tonumber(count)
          end
        end
      end
    end
  end
  return reported[up] or 0
end

local freed = false
if #ended > 0 then
  redis.call('ZREM', KEYS[1], unpack(ended))
  redis.call('HDEL', KEYS[2], unpack(ended))
  -- The owners' load index entries: none unless the index is kept and the owner is eligible.
  local indexed = redis.call('HMGET', KEYS[8], unpack(order))
  for i, owner in ipairs(order) do
    local d = drops[owner]
    local after = redis.call('HINCRBY', KEYS[3], owner, d == 1 and '-1' or string.format('%d', -d))
    if after <= 0 then
      redis.call('HDEL', KEYS[3], owner)
    end
    local cur = indexed[i]
    if cur then
      local c, entry = string.match(cur, '^(%d+) (.*)$')
      redis.call('ZADD', KEYS[7], string.format('%.0f', math.max(after, 0) * tonumber(c)), entry)
    end
    if cap > 0 and not freed then
      local others = held(owner)
      -- At its cap before (as acquire.lua counts), below it now.
      if after + d + others >= cap and math.max(after, 0) + others < cap then
        freed = true
      end
    end
  end
end

-- Statistics, summed per field by the caller.
for i = first_stat, last_stat, 2 do
  redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1])
end

if freed then
  redis.call('PUBLISH', channel, 'r')
  return 1
end
return 0
