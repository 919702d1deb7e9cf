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
-- the live count the other scripts keep in it. Else it is built from the live counts, and meta
-- `load` is "b" until the declaration ends: the other scripts keep the entries made so far up to
-- date, and acquire.lua does not walk an index under construction.
--
-- A declaration's digest (of the strategy and the member list, made by the caller) is kept in
-- meta `n` after the member count: declaring what is already declared (an instance starting
-- with the pool as the others have it, a reload that left the pool alone) reads two fields and
-- writes nothing. Versions before the digest set `n` to the count alone when they declare, so a
-- declaration of theirs is never taken for the last one of this version.
--
-- Declaring in stages. Redis runs one script at a time, and declaring 100,000 members in one
-- call held it for 0.5-1.5 s, past every other instance's store timeout. So a pool of more than
-- CHUNK members is declared in a run of calls, each doing at most CHUNK members' work:
--   begin   claims the declaration for its digest; another declaration under way (its claim
--           renewed by each of its calls within `hold` ms) makes it wait ("busy"), one of the
--           same digest is joined (the same calls, made twice, change nothing);
--   stage   adds members with their positions to `decl`, the declaration's staging set;
--   sweep   removes the members of a page of `state` that `decl` does not hold;
--   apply   makes a run of `decl`'s members members: state, position, load index entry;
--   finish  sets the pool-wide fields and the digest, and drops `decl`.
-- In between the pool serves from what it holds: members that left go as the sweep reaches
-- them, members that joined come as they are applied, round-robin follows the positions written
-- so far. A call that finds another declaration's claim (its own lapsed and was taken over) or
-- none (Redis lost its data) answers "superseded", and the caller starts again; one that finds
-- its digest declared already (a joined declaration that another caller finished) answers
-- "done". Mode "all" does every step in one call: a pool of up to CHUNK members, where Redis
-- holds at most 4 x CHUNK (else it answers -1 and does nothing: declare in stages). Only the
-- commands of the documented ACL are used (docs/operations.md): DEL, not UNLINK.
--
-- KEYS[1]  meta     HASH  rr = round-robin cursor, n = "<member count> <digest>" (the digest
--                         once a declaration of this version ended), load = "1" while the load
--                         index is kept ("b" while a declaration builds it); decl, decl_until,
--                         decl_strategy, decl_n = the declaration under way: its digest, the end
--                         of its claim (ms), strategy and member count
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
-- KEYS[11] decl     ZSET  the declaration under way: upstream -> position
--
-- ARGV[1] the mode, then:
--   all     strategy, digest, the members in configured order (distinct)
--           -> 1 the pool was new to this Redis (its state lost or never made), 0 declared or
--              already so, -1 too large for one call
--   begin   strategy, digest, now (ms), hold (ms), member count
--           -> {"go", "1" new pool | "0"} | {"done"} | {"busy", ms the claim has left}
--   stage   digest, now, hold, the first member's position, members
--   sweep   digest, now, hold, HSCAN cursor ("0" first)     -> {"more", next cursor, "0" at the end}
--   apply   digest, now, hold, first rank in decl           -> {"more", next rank} | {"ok"}
--   finish  digest, now, hold                                -> {"ok"}
--   stage, sweep, apply and finish may answer {"superseded"} or {"done"} instead (above).
-- strategy: least-used | weighted | least-connections | round-robin

local CHUNK = 1000
local mode = ARGV[1]

if #KEYS < 11 then
  return redis.error_reply('ERR configure: bad arguments')
end

local function valid_strategy(s)
  return s == 'least-used' or s == 'weighted' or s == 'least-connections' or s == 'round-robin'
end

-- The digest of the last declaration, from meta `n` (nil: none of this version ended since).
local function declared(n)
  return n and string.match(n, '^%d+ (.+)$')
end

-- Removes member `up` and its load index entry.
local function remove(up)
  redis.call('HDEL', KEYS[2], up)
  redis.call('ZREM', KEYS[3], up)
  redis.call('ZREM', KEYS[4], up)
  local cur = redis.call('HGET', KEYS[10], up)
  if cur then
    redis.call('ZREM', KEYS[9], string.match(cur, '^%d+ (.*)$'))
    redis.call('HDEL', KEYS[10], up)
  end
end

-- Claims a declaration of `n` members for `digest` and readies the load index for `strategy`.
local function start(strategy, digest, hold_until, n)
  redis.call('DEL', KEYS[11])
  redis.call('HSET', KEYS[1], 'decl', digest, 'decl_until', hold_until, 'decl_strategy', strategy,
    'decl_n', string.format('%d', n))
  redis.call('HSETNX', KEYS[1], 'rr', '0')
  -- Until it ends, the pool is not at any digest (an abandoned declaration leaves it so).
  local count = string.match(redis.call('HGET', KEYS[1], 'n') or '', '^(%d+)') or '0'
  redis.call('HSET', KEYS[1], 'n', count)
  if strategy == 'least-connections' then
    if redis.call('HGET', KEYS[1], 'load') ~= '1' then
      redis.call('DEL', KEYS[9], KEYS[10])
      redis.call('HSET', KEYS[1], 'load', 'b')
    end
  else
    redis.call('HDEL', KEYS[1], 'load')
    redis.call('DEL', KEYS[9], KEYS[10])
  end
end

-- Stages members ARGV[from..] at positions `first`, `first` + 1, ...
local function stage(first, from)
  local batch = {}
  for i = from, #ARGV do
    if ARGV[i] == '' then
      return redis.error_reply('ERR configure: empty member')
    end
    batch[#batch + 1] = string.format('%d', first + i - from)
    batch[#batch + 1] = ARGV[i]
    if #batch >= 2 * CHUNK then
      redis.call('ZADD', KEYS[11], unpack(batch))
      batch = {}
    end
  end
  if #batch > 0 then
    redis.call('ZADD', KEYS[11], unpack(batch))
  end
end

-- Removes the members of one page of `state` that are not staged; the next cursor.
local function sweep(cursor)
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', CHUNK)
  local fields = page[2]
  for i = 1, #fields, 2 do
    local up = fields[i]
    if not redis.call('ZSCORE', KEYS[11], up) then
      remove(up)
    end
  end
  return page[1]
end

-- Applies the staged members of ranks first .. first + count - 1; how many there were.
local function apply(first, count)
  local lc = redis.call('HGET', KEYS[1], 'decl_strategy') == 'least-connections'
  local floor = 0
  local lowest = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if lowest[2] then
    floor = tonumber(lowest[2])
  end
  local batch = redis.call('ZRANGE', KEYS[11], string.format('%d', first),
    string.format('%d', first + count - 1), 'WITHSCORES')
  for i = 1, #batch, 2 do
    local up, pos_s = batch[i], batch[i + 1]
    local cur = redis.call('HGET', KEYS[2], up)
    local allocs
    if not cur then
      cur = '1|1|1|' .. string.format('%.0f', floor) .. '|0'
      redis.call('HSET', KEYS[2], up, cur)
      redis.call('ZADD', KEYS[3], string.format('%.0f', floor), up)
      allocs = floor
    end
    redis.call('ZADD', KEYS[4], pos_s, up)
    if lc then
      -- An eligible member's entry in the load index (the same entry as acquire.lua makes).
      local e, c = string.match(cur, '^(%d)|%d|(%d+)|')
      local old = redis.call('HGET', KEYS[10], up)
      if e == '1' then
        c = math.max(tonumber(c), 1)
        allocs = allocs or tonumber(redis.call('ZSCORE', KEYS[3], up) or '0')
        local entry = string.format('%017.0f%08d', allocs, tonumber(pos_s)) .. up
        local value = string.format('%d', c) .. ' ' .. entry
        if old ~= value then
          if old then
            redis.call('ZREM', KEYS[9], string.match(old, '^%d+ (.*)$'))
          end
          local live = tonumber(redis.call('HGET', KEYS[8], up) or '0')
          redis.call('ZADD', KEYS[9], string.format('%.0f', math.max(live, 0) * c), entry)
          redis.call('HSET', KEYS[10], up, value)
        end
      elseif old then
        redis.call('ZREM', KEYS[9], string.match(old, '^%d+ (.*)$'))
        redis.call('HDEL', KEYS[10], up)
      end
    end
  end
  return #batch / 2
end

-- Ends the declaration: the pool-wide fields, the pins, the digest.
local function finish(digest)
  local meta = redis.call('HMGET', KEYS[1], 'decl_strategy', 'decl_n')
  if meta[1] == 'least-connections' then
    redis.call('HSET', KEYS[1], 'load', '1')
  end
  redis.call('HSET', KEYS[1], 'n', (meta[2] or '0') .. ' ' .. digest)
  redis.call('HDEL', KEYS[1], 'decl', 'decl_until', 'decl_strategy', 'decl_n')
  redis.call('DEL', KEYS[11])
  local pin = '~ pins the hashtable/skiplist encoding: as a listpack every lease operation scans all leases'
  redis.call('HSETNX', KEYS[6], '~', pin)
  redis.call('ZADD', KEYS[5], 'NX', '+inf', pin)
  redis.call('DEL', KEYS[7])
end

if mode == 'all' then
  local strategy, digest = ARGV[2], ARGV[3]
  if not valid_strategy(strategy) or not digest or digest == '' or #ARGV - 3 > CHUNK then
    return redis.error_reply('ERR configure: bad arguments')
  end
  local want = {}
  for i = 4, #ARGV do
    if ARGV[i] == '' or want[ARGV[i]] then
      return redis.error_reply('ERR configure: empty or duplicate member')
    end
    want[ARGV[i]] = true
  end
  local fresh = redis.call('EXISTS', KEYS[1]) == 0
  local at = redis.call('HMGET', KEYS[1], 'n', 'decl')
  if declared(at[1]) == digest and not at[2] then
    return 0
  end
  if redis.call('ZCARD', KEYS[4]) > 4 * CHUNK then
    return -1
  end
  -- One call: it takes over any staged declaration under way (whose next call is superseded).
  start(strategy, digest, '0', #ARGV - 3)
  stage(0, 4)
  local cursor = '0'
  repeat
    cursor = sweep(cursor)
  until cursor == '0'
  apply(0, CHUNK)
  finish(digest)
  return fresh and 1 or 0
end

local now = tonumber(ARGV[4] or '')
local hold = tonumber(ARGV[5] or '')

if mode == 'begin' then
  local strategy, digest, n = ARGV[2], ARGV[3], tonumber(ARGV[6] or '')
  if not valid_strategy(strategy) or not digest or digest == '' or not now or not hold
      or not n then
    return redis.error_reply('ERR configure: bad begin arguments')
  end
  local fresh = redis.call('EXISTS', KEYS[1]) == 0
  local at = redis.call('HMGET', KEYS[1], 'n', 'decl', 'decl_until')
  local held_until = tonumber(at[3] or '0') or 0
  if at[2] == digest then
    redis.call('HSET', KEYS[1], 'decl_until', string.format('%.0f', now + hold))
    return {'go', '0'}
  end
  if at[2] and held_until > now then
    return {'busy', string.format('%.0f', held_until - now)}
  end
  if not at[2] and declared(at[1]) == digest then
    return {'done'}
  end
  start(strategy, digest, string.format('%.0f', now + hold), n)
  return {'go', fresh and '1' or '0'}
end

-- The other modes continue the declaration of ARGV[2], while it is still under way.
local digest = ARGV[2]
now = tonumber(ARGV[3] or '')
hold = tonumber(ARGV[4] or '')
if not digest or digest == '' or not now or not hold then
  return redis.error_reply('ERR configure: bad arguments')
end
local at = redis.call('HMGET', KEYS[1], 'n', 'decl')
if at[2] ~= digest then
  if declared(at[1]) == digest then
    return {'done'}
  end
  return {'superseded'}
end
redis.call('HSET', KEYS[1], 'decl_until', string.format('%.0f', now + hold))

if mode == 'stage' then
  local first = tonumber(ARGV[5] or '')
  if not first or #ARGV - 5 > CHUNK then
    return redis.error_reply('ERR configure: bad stage arguments')
  end
  local err = stage(first, 6)
  if err then return err end
  return {'ok'}
elseif mode == 'sweep' then
  local cursor = ARGV[5]
  if not cursor then
    return redis.error_reply('ERR configure: bad sweep arguments')
  end
  if cursor == '0' then
    -- Before the first removal: every member staged, none twice.
    local n = redis.call('HGET', KEYS[1], 'decl_n')
    if tonumber(n) ~= redis.call('ZCARD', KEYS[11]) then
      return redis.error_reply('ERR configure: duplicate or missing member')
    end
  end
  return {'more', sweep(cursor)}
elseif mode == 'apply' then
  local first = tonumber(ARGV[5] or '')
  if not first then
    return redis.error_reply('ERR configure: bad apply arguments')
  end
  if apply(first, CHUNK) < CHUNK then
    return {'ok'}
  end
  return {'more', string.format('%d', first + CHUNK)}
elseif mode == 'finish' then
  finish(digest)
  return {'ok'}
end
return redis.error_reply('ERR configure: unknown mode')
