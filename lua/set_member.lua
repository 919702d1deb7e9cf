-- set_member.lua: applies a health decision (quarantine, restore, cost change) to one member.
--
-- Health is decided in each gateway; this script only makes the allocator follow it. A member
-- leaving eligibility keeps its allocation score aside; one coming back starts at
-- max(its old score, the current minimum), so it is not flooded by least-used. A change is
-- published on the pool's channel as "m\n<origin>\n<upstream>\n<eligible>\n<keeps>\n<cost>" so
-- other gateways hear of it and requests waiting for capacity try again.
--
-- KEYS[1]  meta     HASH  exists once the pool is configured; load = "1" while the load index is
--                         kept, "b" while a declaration builds it
-- KEYS[2]  state    HASH  upstream -> "e|k|c|s|r" (see acquire.lua)
-- KEYS[3]  members  ZSET  eligible upstream -> allocation score
-- KEYS[4]  order    ZSET  upstream -> position in the configured list
-- KEYS[5]  live     HASH  upstream -> live lease count
-- KEYS[6]  load     ZSET  the load index of least-connections (see acquire.lua): an eligible
--                         member's entry, made, moved to its cost or removed here
-- KEYS[7]  load_of  HASH  upstream -> "<cost> <its entry in load>"
--
-- ARGV[1]  upstream
-- ARGV[2]  eligible (0|1)    ARGV[3]  keeps sessions (0|1)    ARGV[4]  cost (>= 1)
-- ARGV[5]  events channel    ARGV[6]  origin: the deciding gateway's instance id
-- ARGV[7]  the member's service level as the deciding gateway last knew it (0 in service,
--          1 quarantined, 2 dead), or "" to apply unconditionally (a restore after data loss)
--
-- Returns  1 when the member's setting changed, 0 when it was already so or is not a member,
--          -1 when the pool is not configured (its state was lost), 2 when the decision was
--          refused: it would bring the member back towards service, but another gateway moved
--          the member out since the deciding one last knew (a decision made on a stale view
--          must not undo a quarantine; the other gateway's change is on its way to it as an
--          event)

local up = ARGV[1]
local e = ARGV[2] == '1'
local k = ARGV[3] == '1'
local c = tonumber(ARGV[4])
local channel = ARGV[5]
local origin = ARGV[6]

if #KEYS < 7 or not up or up == '' or not c or c < 1 or c ~= math.floor(c) or not channel
    or not origin then
  return redis.error_reply('ERR set_member: bad arguments')
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local cur = redis.call('HGET', KEYS[2], up)
if not cur then
  return 0
end
local oe, ok_, oc, os, _ = string.match(cur, '^(%d)|(%d)|(%d+)|([^|]+)|(%d+)$')
if not oe then
  return redis.error_reply('ERR set_member: corrupt member state')
end
local was = oe == '1'
local saved = tonumber(os) or 0

local function level(eligible, keeps)
  if eligible then return 0 elseif keeps then return 1 else return 2 end
end
local current = level(was, ok_ == '1')
local believed = tonumber(ARGV[7] or '')
if believed and level(e, k) < current and believed ~= current then
  return 2
end

local floor = 0
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if first[2] then
  floor = tonumber(first[2])
end

if was and not e then
  local score = redis.call('ZSCORE', KEYS[3], up)
  if score then
    saved = tonumber(score)
  end
  redis.call('ZREM', KEYS[3], up)
elseif e and not was then
  saved = math.max(saved, floor)
  redis.call('ZADD', KEYS[3], saved, up)
end
redis.call('HSET', KEYS[2], up, (e and '1' or '0') .. '|' .. (k and '1' or '0') .. '|'
  .. string.format('%d', c) .. '|' .. string.format('%.0f', saved) .. '|0')

-- The member's load index entry, when the index is kept or being built: made afresh from its
-- allocation score, position, cost and live count while it is eligible, else removed.
if redis.call('HGET', KEYS[1], 'load') then
  local cur = redis.call('HGET', KEYS[7], up)
  if cur then
    redis.call('ZREM', KEYS[6], string.match(cur, '^%d+ (.*)$'))
    redis.call('HDEL', KEYS[7], up)
  end
  if e then
    local allocs = tonumber(redis.call('ZSCORE', KEYS[3], up) or '0')
    local pos = tonumber(redis.call('ZSCORE', KEYS[4], up) or '0')
    local n = tonumber(redis.call('HGET', KEYS[5], up) or '0')
    local entry = string.format('%017.0f%08d', allocs, pos) .. up
    redis.call('ZADD', KEYS[6], string.format('%.0f', math.max(n, 0) * c), entry)
    redis.call('HSET', KEYS[7], up, string.format('%d', c) .. ' ' .. entry)
  end
end

if was ~= e or (ok_ == '1') ~= k or tonumber(oc) ~= c then
  redis.call('PUBLISH', channel, 'm\n' .. origin .. '\n' .. up .. '\n' .. (e and '1' or '0')
    .. '\n' .. (k and '1' or '0') .. '\n' .. string.format('%d', c))
  return 1
end
return 0
