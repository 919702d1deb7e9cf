-- acquire.lua: picks an upstream of one pool and leases it, in one atomic step.
--
-- A sticky request keeps its bound upstream (refreshing the binding's sliding TTL) or binds the
-- first eligible upstream below its cap of its consistent-hash order, set-if-absent: two gateways racing to bind
-- the same new key agree, because the second one finds the first one's binding. Any other request
-- takes the pool's strategy over the eligible members that are below their concurrency cap:
-- least-used / weighted (lowest allocation score; the score grows by the member's cost per
-- lease), least-connections (fewest live leases x cost, read in order from the load index) or
-- round-robin (a cursor in the meta hash). Expired leases (their gateway died) are purged first,
-- so their capacity is back.
--
-- KEYS[1]  meta      HASH    rr = round-robin cursor, load = "1" while the load index is kept
--                            ("b" while a declaration builds it); exists once the pool is configured
-- KEYS[2]  state     HASH    upstream -> "e|k|c|s|r": eligible, keeps sessions, cost,
--                            saved allocation score (while not eligible), round-robin credit
-- KEYS[3]  members   ZSET    eligible upstream -> allocation score
-- KEYS[4]  order     ZSET    upstream -> position in the configured list
-- KEYS[5]  leases    ZSET    lease id -> deadline (ms)
-- KEYS[6]  lease_up  HASH    lease id -> upstream
-- KEYS[7]  live      HASH    upstream -> live lease count
-- KEYS[8]  session_count HASH  live sessions by expiry second, for status (see the session mode)
-- KEYS[9]  instances ZSET    instance -> deadline (ms) of its report (see report.lua)
-- KEYS[10] held      HASH    instance -> its unlisted leases, "<count> <upstream>" lines
-- KEYS[11] load      ZSET    the load index: "<allocs><pos><upstream>" -> listed live x cost,
--                            one entry per eligible member while meta `load` is "1" (below)
-- KEYS[12] load_of   HASH    upstream -> "<cost> <its entry in load>"
-- KEYS[13] sess      STRING  the session's upstream, PXAT = now + session TTL (session modes only)
-- KEYS[13] subset    ZSET    a label filter's members -> allocations through the filter
--                            (within and many-within modes; KEYS[14] in session-within mode)
--
-- ARGV[1]  now (ms)           ARGV[2]  lease id (chosen by the caller, unique), or "-"
-- ARGV[3]  lease deadline (ms, after now)   ARGV[4]  cap: live leases per upstream (0 = none)
-- ARGV[5]  strategy: least-used | weighted | least-connections | round-robin
-- ARGV[6]  events channel (a purge that freed capacity publishes "r")
-- ARGV[7]  mode: any | many | many-within | session | within | session-within
--   any:     ARGV[8..]  upstreams to exclude (already tried)
--   many:    ARGV[8..]  lease ids or "-" (ARGV[2] is ignored): one plain acquire per id, in
--                       order, as if each were its own run; the reply is the list of their
--                       replies, each as one string: "granted <bound_now> <upstream>",
--                       "cap <ms>", "none" or "unconfigured" (a flat list of strings costs the
--                       client a fraction of a list of lists to parse). A gateway sends the plain
--                       acquires that queued up while its last call was under way this way (or
--                       as a tally, below, when they are unlisted under least-used or weighted),
--                       so Redis pays the per-call cost once for all of them.
--   tally:   ARGV[8] n: n plain acquires of unlisted leases, without a cap, under least-used or
--            weighted, counted as `many` would count them; the reply is one flat list of
--            upstream, count pairs, in the order of each one's first grant ({} when nothing is
--            eligible, {"unconfigured"} as ever). A gateway refilling its stock of grants takes
--            them this way: the calls' bulk, whose order within a call nobody needs.
--   tally-within: the same for n `within` acquires in a label filter's subset (KEYS[13], named
--            only; {"nosubset"} when it is missing), counted as `many-within` would count them.
--   many-within: ARGV[8..] lease ids or "-": one `within` acquire per id, nothing excluded, in
--            order, replied as `many` replies; the subset (KEYS[13]) is named only, and when it
--            is missing every reply is "nosubset" (the caller sends its members in a `within`).
--   session: ARGV[8] session TTL (ms)  ARGV[9] rebind (0|1)  ARGV[10] session key (checked only)
--            ARGV[11..] preferred upstreams, in consistent-hash order
--   within:  an `any` among the members of a label filter's subset only. ARGV[8] count e of
--            upstreams to exclude, ARGV[9..8+e] those, then the subset's members: sent when the
--            caller has not seen the subset created (it is made from them when missing; with
--            none, a missing subset replies {"nosubset"}).
--   session-within: a session inside a label filter: ARGV[8..10] as session, ARGV[11] count p
--            of preferred upstreams, ARGV[12..11+p] those, then the subset's members as for
--            within. A bound upstream outside the subset is treated as one that left the pool.
--
-- A subset is named by its filter and a digest of its members, so a membership or label change
-- makes a new one; an unused one expires after SUBSET_TTL. Inside a subset least-used counts the
-- allocations made through it (its ZSET's scores); round-robin keeps its cursor in the meta hash
-- under `rr:<subset key>`.
--
-- Returns  {"granted", upstream, bound_now "0"|"1"}
--        | {"cap", earliest lease deadline (ms) or "-1"}   every candidate is at its cap
--        | {"unavailable", upstream}                      the session's upstream cannot serve it
--        | {"none"}                                       no eligible candidate at all
--        | {"unconfigured"}                               the pool's state is missing (a reset)
--        | {"nosubset"}                                   the subset is missing: send its members
--
-- A lease id "-" asks for an unlisted lease: the grant counts the allocation and records
-- nothing else. Gateways take unlisted leases where nothing on the hot path reads lease records:
-- without a cap, under any strategy but least-connections. Each gateway counts its unlisted
-- leases itself and reports the counts once a second with a deadline (report.lua), so a dead
-- gateway's count lapses as its leases would. Where a cap or least-connections reads the live
-- counts, the counts other gateways reported are added (a pool that gained a cap by a reload
-- still has some).
--
-- The load index orders the eligible members as least-connections ranks them: by score, the
-- listed live leases x cost; then by entry, whose fixed-width prefix is the allocation score (17
-- digits) and the configured position (8 digits). So a least-connections acquire reads members
-- from the least loaded on and stops at the first one it may take, instead of weighing every
-- member. It is read while meta `load` is "1": configure.lua builds it for a least-connections
-- pool and drops it for any other (so its upkeep costs other pools nothing). While a staged
-- declaration builds it, `load` is "b": the entries made so far are kept, not read. A
-- least-connections acquire that finds no index (a gateway of another strategy declared the pool
-- last) builds it from the state when the pool has up to BUILD_MAX members; a larger pool's
-- acquires choose as least-used does until the next least-connections declaration, since
-- building it in one call held Redis for a second at 100,000 members. Every script that changes
-- an input while it is kept ("1" or "b") moves the member's entry:
-- here a grant and the purge, release.lua, set_member.lua. Unlisted leases other gateways report
-- are not in it: they only raise a load, so the walk below adds them and goes on past the
-- members that have some, and a report that lapses needs no write.
--
-- Numbers go to Redis as the caller's strings where they can: Redis 7.0 formats every Lua number
-- argument with printf("%.17g"), which was a tenth of this script's cost.

local now_s = ARGV[1]
local now = tonumber(now_s)
local lease = ARGV[2]
local deadline_s = ARGV[3]
local deadline = tonumber(deadline_s)
local cap = tonumber(ARGV[4])
local strategy = ARGV[5]
local channel = ARGV[6]
local mode = ARGV[7]

-- Validate everything before the first write: Redis does not roll back a half-run script.
if #KEYS < 12 or not now or not deadline or deadline <= now or not cap or cap < 0
    or not channel or (mode ~= 'many' and mode ~= 'many-within' and (not lease or lease == '')) then
  return redis.error_reply('ERR acquire: bad arguments')
end
if strategy ~= 'least-used' and strategy ~= 'weighted' and strategy ~= 'least-connections'
    and strategy ~= 'round-robin' then
  return redis.error_reply('ERR acquire: unknown strategy')
end
local sess_ttl, rebind, skey
-- The ARGV ranges of the preferred upstreams, the excluded ones and a subset's members.
local pref_first, pref_last = 11, #ARGV
local excl_first, excl_last = 8, #ARGV
local sub, sub_first = nil, #ARGV + 1
-- many-within: one `within` acquire per lease id, in order.
local batch_within = false
local tally_n
if mode == 'session' or mode == 'session-within' then
  sess_ttl = tonumber(ARGV[8])
  rebind = ARGV[9] == '1'
  skey = ARGV[10]
  if #KEYS < 13 or not sess_ttl or sess_ttl <= 0 or not skey or skey == '' then
    return redis.error_reply('ERR acquire: bad session arguments')
  end
  if mode == 'session-within' then
    local p = tonumber(ARGV[11])
    if #KEYS < 14 or not p or p < 0 or 11 + p > #ARGV then
      return redis.error_reply('ERR acquire: bad session-within arguments')
    end
    sub = KEYS[14]
    pref_first, pref_last = 12, 11 + p
    sub_first = 12 + p
    mode = 'session'
  end
elseif mode == 'within' then
  local e = tonumber(ARGV[8])
  if #KEYS < 13 or not e or e < 0 or 8 + e > #ARGV then
    return redis.error_reply('ERR acquire: bad within arguments')
  end
  sub = KEYS[13]
  excl_first, excl_last = 9, 8 + e
  sub_first = 9 + e
  mode = 'any'
elseif mode == 'many' or mode == 'many-within' then
  if #ARGV < 8 then
    return redis.error_reply('ERR acquire: no lease ids')
  end
  for i = 8, #ARGV do
    if ARGV[i] == '' then
      return redis.error_reply('ERR acquire: empty lease id')
    end
  end
  if mode == 'many-within' then
    if #KEYS < 13 then
      return redis.error_reply('ERR acquire: bad many-within arguments')
    end
    sub = KEYS[13]
    batch_within = true
    mode = 'any'
  end
elseif mode == 'tally' or mode == 'tally-within' then
  tally_n = tonumber(ARGV[8])
  if not tally_n or tally_n < 1 or tally_n ~= math.floor(tally_n) or cap ~= 0
      or (strategy ~= 'least-used' and strategy ~= 'weighted')
      or (mode == 'tally-within' and #KEYS < 13) then
    return redis.error_reply('ERR acquire: bad tally arguments')
  end
  if mode == 'tally-within' then
    sub = KEYS[13]
    mode = 'tally'
  end
elseif mode ~= 'any' then
  return redis.error_reply('ERR acquire: unknown mode')
end
-- The same reply for every acquire of a batch.
local function each(reply)
  local all = {}
  for i = 8, #ARGV do
    all[#all + 1] = reply
  end
  return all
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  if mode == 'many' or batch_within then
    return each('unconfigured')
  end
  return {'unconfigured'}
end

-- The load index: walked while complete ("1"), kept up to date while built too ("b").
local load_state = redis.call('HGET', KEYS[1], 'load')
local indexed = load_state == '1'
local kept = indexed or load_state == 'b'
local CHUNK = 64
-- The largest pool whose missing load index an acquire builds (about 15 ms of Redis).
local BUILD_MAX = 1000
local PURGE_MAX = '1000'
local SUBSET_TTL = '86400000'

-- A missing subset is made from the members the caller sent; without them the caller is asked.
if sub and redis.call('EXISTS', sub) == 0 then
  if batch_within then
    return each('nosubset')
  end
  if sub_first > #ARGV then
    return {'nosubset'}
  end
  local batch = {}
  for i = sub_first, #ARGV do
    batch[#batch + 1] = '0'
    batch[#batch + 1] = ARGV[i]
    if #batch >= 1000 then
      redis.call('ZADD', sub, unpack(batch))
      batch = {}
    end
  end
  if #batch > 0 then
    redis.call('ZADD', sub, unpack(batch))
  end
  redis.call('PEXPIRE', sub, SUBSET_TTL)
end

-- An index range for ZRANGE as strings (see above: no float formatting).
local function range(first, count)
  if first == 0 and count == CHUNK then return '0', '63' end
  return string.format('%d', first), string.format('%d', first + count - 1)
end

local function decode(v)
  if not v then return nil end
  local e, k, c, s, r = string.match(v, '^(%d)|(%d)|(%d+)|([^|]+)|(%d+)$')
  if not e then return nil end
  local cost = tonumber(c)
  return {e = e == '1', k = k == '1', c = cost, s = tonumber(s) or 0, r = tonumber(r),
          step = cost >= 1 and c or '1'}
end

local function encode(m)
  return (m.e and '1' or '0') .. '|' .. (m.k and '1' or '0') .. '|' .. string.format('%d', m.c)
    .. '|' .. string.format('%.0f', m.s) .. '|' .. string.format('%d', m.r)
end

-- A member's entry in the load index (see the header): its allocation score and configured
-- position, fixed width, then its id.
local function entry_of(allocs, pos, up)
  return string.format('%017.0f%08d', allocs, pos) .. up
end

-- Moves `up`'s entry in the load index to its allocation score `allocs` and listed live count
-- `n` (each read here when nil). A member without an entry is not in the index: not eligible,
-- or the index is not kept.
local function reindex(up, allocs, n)
  local cur = redis.call('HGET', KEYS[12], up)
  if not cur then return end
  local c, old = string.match(cur, '^(%d+) (.*)$')
  local entry = old
  if allocs then
    entry = entry_of(tonumber(allocs), tonumber(string.sub(old, 18, 25)), up)
    if entry ~= old then
      redis.call('ZREM', KEYS[11], old)
      redis.call('HSET', KEYS[12], up, c .. ' ' .. entry)
    end
  end
  n = tonumber(n or redis.call('HGET', KEYS[7], up) or '0')
  redis.call('ZADD', KEYS[11], string.format('%.0f', math.max(n, 0) * tonumber(c)), entry)
end

-- Builds the load index from the state (see the header): the eligible members, their
-- allocation scores, positions, costs and listed live counts.
local function build_index()
  redis.call('DEL', KEYS[11], KEYS[12])
  local live_of, pos_of = {}, {}
  local flat = redis.call('HGETALL', KEYS[7])
  for i = 1, #flat, 2 do live_of[flat[i]] = tonumber(flat[i + 1]) end
  flat = redis.call('ZRANGE', KEYS[4], '0', '-1', 'WITHSCORES')
  for i = 1, #flat, 2 do pos_of[flat[i]] = tonumber(flat[i + 1]) end
  flat = redis.call('ZRANGE', KEYS[3], '0', '-1', 'WITHSCORES')
  local scores, entries = {}, {}
  for i = 1, #flat, 2 do
    local up = flat[i]
    local m = decode(redis.call('HGET', KEYS[2], up))
    if m and m.e then
      local c = math.max(m.c, 1)
      local entry = entry_of(tonumber(flat[i + 1]), pos_of[up] or 0, up)
      scores[#scores + 1] = string.format('%.0f', math.max(live_of[up] or 0, 0) * c)
      scores[#scores + 1] = entry
      entries[#entries + 1] = up
      entries[#entries + 1] = string.format('%d', c) .. ' ' .. entry
    end
    if #scores >= 1000 then
      redis.call('ZADD', KEYS[11], unpack(scores))
      redis.call('HSET', KEYS[12], unpack(entries))
      scores, entries = {}, {}
    end
  end
  if #scores > 0 then
    redis.call('ZADD', KEYS[11], unpack(scores))
    redis.call('HSET', KEYS[12], unpack(entries))
  end
  redis.call('HSET', KEYS[1], 'load', '1')
  load_state, indexed, kept = '1', true, true
end

-- Members' states as read and decoded in this run: the acquires of one batch ask for the same
-- few members again and again. Every write of a state in this script encodes the very table held
-- here, so it never goes stale.
local states = {}
local function state_of(up)
  local m = states[up]
  if m == nil then
    m = decode(redis.call('HGET', KEYS[2], up)) or false
    states[up] = m
  end
  return m or nil
end

-- Leases past their deadline are void: their gateway is presumed dead.
local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_s, 'LIMIT', '0', PURGE_MAX)
if #expired > 0 then
  local ups = redis.call('HMGET', KEYS[6], unpack(expired))
  local dropped = {}
  for _, up in ipairs(ups) do
    if up then
      local n = redis.call('HINCRBY', KEYS[7], up, '-1')
      if n <= 0 then
        redis.call('HDEL', KEYS[7], up)
      end
      dropped[up] = n
    end
  end
  if kept then
    for up, n in pairs(dropped) do
      reindex(up, nil, n)
    end
  end
  redis.call('HDEL', KEYS[6], unpack(expired))
  redis.call('ZREM', KEYS[5], unpack(expired))
  if cap > 0 then
    redis.call('PUBLISH', channel, 'r')
  end
end

-- Grants of this run not yet counted in the live HASH (a `many` batch counts them at its end).
local pending = {}

-- Unlisted leases other gateways reported, per upstream (read once, when first needed).
local reported
local function held(up)
  if not reported then
    reported = {}
    local now_ex = '(' .. now_s
    local alive = redis.call('ZRANGEBYSCORE', KEYS[9], now_ex, '+inf')
    if #alive > 0 then
      for _, lines in ipairs(redis.call('HMGET', KEYS[10], unpack(alive))) do
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

local function live(up)
  return tonumber(redis.call('HGET', KEYS[7], up) or '0') + (pending[up] or 0) + held(up)
end

local function at_cap(up)
  return cap > 0 and live(up) >= cap
end

local function cap_reply()
  local first = redis.call('ZRANGE', KEYS[5], '0', '0', 'WITHSCORES')
  -- An infinite score is the encoding pin (see configure.lua): there is no lease.
  if not first[2] or first[2] == 'inf' then
    return {'cap', '-1'}
  end
  return {'cap', first[2]}
end

-- Counts an allocation of `up`: the score grows by the member's cost (in the members ZSET while
-- it is eligible, else in its saved score). Returns the new score of an eligible member.
local function count_allocation(up, m)
  local score
  if m.e then
    score = redis.call('ZINCRBY', KEYS[3], m.step, up)
  else
    m.s = m.s + math.max(m.c, 1)
    redis.call('HSET', KEYS[2], up, encode(m))
  end
  if sub and mode == 'any' and (strategy == 'least-used' or strategy == 'weighted') then
    redis.call('ZINCRBY', sub, m.step, up)
  end
  return score
end

-- Leases `up` and counts the allocation. The lease id is claimed first, so an id in use gets nil
-- and nothing of the grant is written. Ids are 63 random bits: that is a caller bug.
local function grant(up, m, bound_now)
  if lease == '-' then
    local score = count_allocation(up, m)
    if kept and score then reindex(up, score, nil) end
    return {'granted', up, bound_now}
  end
  if redis.call('HSETNX', KEYS[6], lease, up) == 0 then
    return nil
  end
  local score = count_allocation(up, m)
  redis.call('ZADD', KEYS[5], deadline_s, lease)
  local n = redis.call('HINCRBY', KEYS[7], up, '1')
  if kept and score then reindex(up, score, n) end
  return {'granted', up, bound_now}
end

local function in_use()
  return redis.error_reply('ERR acquire: lease id in use')
end

-- Live sessions are counted by expiry second in KEYS[8], so that a binding costs no more than
-- its own key: field <s> = bindings whose expiry (ms) rounded up to whole seconds is s, `n` =
-- the sum of those fields, `swept` = the last second whose field was dropped (all of its
-- bindings had expired). Binding adds to a second, a renewal into another second moves it there
-- (the old one from the key's PEXPIRETIME, exact because the key's expiry is set here with
-- PXAT/PEXPIREAT), and deleting takes it out. BUCKET_MS and sweep_counts are the same in
-- status.lua (and BUCKET_MS in unbind.lua and end_session.lua).
local BUCKET_MS = 1000
-- Past seconds a sweep drops one by one; after a longer idle time it reads the fields instead.
local SWEEP_SPAN = 1000

local function hdel_all(key, fields)
  for i = 1, #fields, 1000 do
    redis.call('HDEL', key, unpack(fields, i, math.min(i + 999, #fields)))
  end
end

-- Drops the fields of the seconds that have passed by `now` and takes their bindings off `n`;
-- returns the last second swept. Bounded: at most SWEEP_SPAN fields, or one read of the hash,
-- whose fields are at most the longest session TTL in seconds plus two.
local function sweep_counts(counts, now)
  local now_b = math.floor(now / BUCKET_MS)
  local swept = tonumber(redis.call('HGET', counts, 'swept'))
  if swept and swept >= now_b then return swept end
  local gone, past = 0, {}
  if swept and now_b - swept <= SWEEP_SPAN then
    for b = swept + 1, now_b do
      past[#past + 1] = string.format('%d', b)
    end
    for _, c in ipairs(redis.call('HMGET', counts, unpack(past))) do
      if c then gone = gone + tonumber(c) end
    end
  else
    local all = redis.call('HGETALL', counts)
    for i = 1, #all, 2 do
      local b = tonumber(all[i])
      if b and b <= now_b then
        past[#past + 1] = all[i]
        gone = gone + tonumber(all[i + 1])
      end
    end
  end
  hdel_all(counts, past)
  if gone > 0 then
    redis.call('HINCRBY', counts, 'n', string.format('%d', -gone))
  end
  redis.call('HSET', counts, 'swept', string.format('%d', now_b))
  return now_b
end

local function bucket_of(expiry_ms)
  return math.ceil(expiry_ms / BUCKET_MS)
end

if mode == 'session' then
  local counts = KEYS[8]
  local swept = sweep_counts(counts, now)
  local expiry = now + sess_ttl
  local expiry_s = string.format('%.0f', expiry)
  local b_new = bucket_of(expiry)
  -- Counts a binding expiring in second b (one already swept is past: not counted).
  local function count_in(b)
    if b > swept then
      redis.call('HINCRBY', counts, string.format('%d', b), '1')
      redis.call('HINCRBY', counts, 'n', '1')
    end
  end
  -- Takes out the binding whose expiry was `old` (PEXPIRETIME: ms, or < 0 for none), if its
  -- second is still counted. A key an older version bound (with PX and no count) may take one
  -- off a second it shares with others: the count is off by it until that second passes.
  local function uncount(old)
    if old <= 0 then return end
    local f = string.format('%d', bucket_of(old))
    local c = redis.call('HGET', counts, f)
    if not c then return end
    if tonumber(c) <= 1 then
      redis.call('HDEL', counts, f)
    else
      redis.call('HINCRBY', counts, f, '-1')
    end
    redis.call('HINCRBY', counts, 'n', '-1')
  end
  local bound = redis.call('GET', KEYS[13])
  if bound then
    local m = state_of(bound)
    -- A member whose labels no longer match left the filter: as if it left the pool.
    if m and sub and not redis.call('ZSCORE', sub, bound) then
      m = nil
    end
    if m and m.k then
      -- No teleporting: a live binding keeps its upstream, even a degraded or quarantined one.
      if at_cap(bound) then
        return cap_reply()
      end
      local granted = grant(bound, m, '0')
      if not granted then return in_use() end
      local old = redis.call('PEXPIRETIME', KEYS[13])
      redis.call('PEXPIREAT', KEYS[13], expiry_s)
      if old <= 0 or bucket_of(old) ~= b_new then
        uncount(old)
        count_in(b_new)
      end
      return granted
    end
    if not rebind then
      return {'unavailable', bound}
    end
    uncount(redis.call('PEXPIRETIME', KEYS[13]))
    redis.call('DEL', KEYS[13])
  end
  -- A new binding: the first preferred member in service that has room. One at its cap is no
  -- candidate; only when every eligible one is at its cap does the session wait.
  local capped = false
  for i = pref_first, pref_last do
    local up = ARGV[i]
    local m = state_of(up)
    if m and m.e and at_cap(up) then
      capped = true
    elseif m and m.e then
      local granted = grant(up, m, '1')
      if not granted then return in_use() end
      redis.call('SET', KEYS[13], up, 'PXAT', expiry_s)
      count_in(b_new)
      return granted
    end
  end
  if capped then
    return cap_reply()
  end
  return {'none'}
end

-- A plain acquire of `lease` by the pool's strategy, skipping `exclude`.
local exclude = {}

-- Calls visit(upstream, state) for the members of `zset`, in its order, read CHUNK at a time,
-- that are not excluded and have a state, until visit returns a reply, which is returned (nil
-- when none did).
local function each_member(zset, visit)
  local start = 0
  while true do
    local lo, hi = range(start, CHUNK)
    local batch = redis.call('ZRANGE', zset, lo, hi)
    if #batch == 0 then return nil end
    for _, up in ipairs(batch) do
      if not exclude[up] then
        local m = state_of(up)
        if m then
          local reply = visit(up, m)
          if reply then return reply end
        end
      end
    end
    start = start + CHUNK
  end
end

-- Least-connections within a subset weighs every member of it (there is no load index per
-- subset: every script that moves a load would have to find the subsets a member is in). The
-- subset's eligible members not excluded, in its order, with what the rule weighs: `l` live
-- leases (listed and reported), `a` allocation score and `p` position, the last two from the
-- load index's entry while the index is complete. Read a chunk at a time, one HMGET each for the
-- chunk's states, live counts and entries.
local function lc_candidates()
  local cands = {}
  local start = 0
  while true do
    local lo, hi = range(start, CHUNK)
    local batch = redis.call('ZRANGE', sub, lo, hi)
    if #batch == 0 then return cands end
    local raw = redis.call('HMGET', KEYS[2], unpack(batch))
    local lives = redis.call('HMGET', KEYS[7], unpack(batch))
    local entries = indexed and redis.call('HMGET', KEYS[12], unpack(batch)) or {}
    for i, up in ipairs(batch) do
      local m = states[up]
      if m == nil then
        m = decode(raw[i]) or false
        states[up] = m
      end
      if m and m.e and not exclude[up] then
        local c = {up = up, m = m, l = tonumber(lives[i] or '0') + (pending[up] or 0) + held(up)}
        local entry = entries[i] and string.match(entries[i], '^%d+ (.*)$')
        if entry then
          c.a, c.p = tonumber(string.sub(entry, 1, 17)), tonumber(string.sub(entry, 18, 25))
        else
          c.a = tonumber(redis.call('ZSCORE', KEYS[3], up) or m.s)
          c.p = tonumber(redis.call('ZSCORE', KEYS[4], up) or '0')
        end
        cands[#cands + 1] = c
      end
    end
    start = start + CHUNK
  end
end

-- The candidate least-connections takes: below its cap, fewest live leases x cost, then fewest
-- allocations, then first in the configured order (the first in the subset's order on a tie).
local function lc_best(cands)
  local best, best_load
  for _, c in ipairs(cands) do
    if cap == 0 or c.l < cap then
      local load = c.l * math.max(c.m.c, 1)
      if not best or load < best_load or (load == best_load and (c.a < best.a
          or (c.a == best.a and c.p < best.p))) then
        best, best_load = c, load
      end
    end
  end
  return best
end

-- Grants candidate `c` and moves its figures as the grant moved them in Redis, so that the next
-- acquire of a batch weighs it as a run of its own would.
local function lc_grant(c)
  local granted = grant(c.up, c.m, '0')
  if not granted then return in_use() end
  if lease ~= '-' then c.l = c.l + 1 end
  c.a = c.a + math.max(c.m.c, 1)
  return granted
end

-- One least-connections acquire among the candidates: a grant, or the cap reply when every
-- candidate is at its cap, or none when there is no candidate.
local function lc_pick(cands)
  local best = lc_best(cands)
  if best then return lc_grant(best) end
  if #cands > 0 then return cap_reply() end
  return {'none'}
end

-- A plain acquire among a subset's members: its ZSET is walked instead of the pool's, and a
-- member out of service, which stays in it, is passed over.
local function pick_within()
  local saw = false
  if strategy == 'least-used' or strategy == 'weighted' then
    local granted = each_member(sub, function(up, m)
      if not m.e then return nil end
      saw = true
      if not at_cap(up) then
        return grant(up, m, '0') or in_use()
      end
    end)
    if granted then return granted end
  elseif strategy == 'least-connections' then
    return lc_pick(lc_candidates())
  else
    -- Round-robin over the subset in member-id order (its scores stay 0), from its cursor.
    local field = 'rr:' .. sub
    local n = redis.call('ZCARD', sub)
    local cursor = tonumber(redis.call('HGET', KEYS[1], field) or '0') or 0
    if cursor >= n then cursor = 0 end
    local step = 0
    while step < n do
      local idx = (cursor + step) % n
      local stop = math.min(idx + CHUNK - 1, n - 1, idx + (n - step) - 1)
      local lo, hi = range(idx, stop - idx + 1)
      local batch = redis.call('ZRANGE', sub, lo, hi)
      if #batch == 0 then break end
      for j, up in ipairs(batch) do
        step = step + 1
        if not exclude[up] then
          local m = state_of(up)
          if m and m.e then
            saw = true
            if not at_cap(up) then
              local granted = grant(up, m, '0')
              if not granted then return in_use() end
              redis.call('HSET', KEYS[1], field, string.format('%d', (idx + j) % n))
              return granted
            end
          end
        end
      end
    end
  end
  if saw then
    return cap_reply()
  end
  return {'none'}
end

local function pick()
  if sub then
    return pick_within()
  end
  local saw = false
  -- Ascending score, ties by id: the first member below its cap wins.
  local function least_used()
    return each_member(KEYS[3], function(up, m)
      saw = true
      if not at_cap(up) then
        return grant(up, m, '0') or in_use()
      end
    end)
  end

  if strategy == 'least-used' or strategy == 'weighted' then
    local granted = least_used()
    if granted then
      return granted
    end
  elseif strategy == 'least-connections' then
    -- Fewest live leases x cost, then fewest allocations, then configured order: the load
    -- index's order, read from its start. An entry's key there is a floor of the member's own
    -- (the reported leases only add to it), so once the best candidate so far is no greater than
    -- the next entry's key, no member after it can beat it; without reports that is the first
    -- candidate. The walk passes over the members excluded, at their cap or with reported leases.
    if not load_state and redis.call('ZCARD', KEYS[3]) <= BUILD_MAX then
      build_index()
    end
    if not indexed then
      -- No index to read (see the header): chosen as least-used chooses, not by weighing every
      -- member of a large pool in one call.
      local granted = least_used()
      if granted then return granted end
      if saw then return cap_reply() end
      return {'none'}
    end
    local best, best_m, best_key
    local function less(a, b)
      return a[1] < b[1] or (a[1] == b[1] and (a[2] < b[2] or (a[2] == b[2] and a[3] < b[3])))
    end
    local start, size, done = 0, 8, false
    while not done do
      local lo, hi = range(start, size)
      local batch = redis.call('ZRANGE', KEYS[11], lo, hi, 'WITHSCORES')
      if #batch == 0 then break end
      for i = 1, #batch, 2 do
        local entry = batch[i]
        local floor = {tonumber(batch[i + 1]), tonumber(string.sub(entry, 1, 17)),
                       tonumber(string.sub(entry, 18, 25))}
        if best and not less(floor, best_key) then
          done = true
          break
        end
        local up = string.sub(entry, 26)
        if not exclude[up] then
          local m = state_of(up)
          if m and m.e then
            saw = true
            local l = live(up)
            if cap == 0 or l < cap then
              local key = {l * math.max(m.c, 1), floor[2], floor[3]}
              if not best or less(key, best_key) then
                best, best_m, best_key = up, m, key
              end
              -- Its own key is the floor: nothing after it is less.
              if key[1] <= floor[1] then
                done = true
                break
              end
            end
          end
        end
      end
      start = start + size
      size = CHUNK
    end
    if best then
      return grant(best, best_m, '0') or in_use()
    end
  else
    -- Round-robin from the cursor; a member of cost c takes one turn in c.
    local n = redis.call('ZCARD', KEYS[4])
    local cursor = tonumber(redis.call('HGET', KEYS[1], 'rr') or '0') or 0
    if cursor >= n then cursor = 0 end
    local step = 0
    while step < n do
      local idx = (cursor + step) % n
      local stop = math.min(idx + CHUNK - 1, n - 1, idx + (n - step) - 1)
      local lo, hi = range(idx, stop - idx + 1)
      local batch = redis.call('ZRANGE', KEYS[4], lo, hi)
      if #batch == 0 then break end
      for j, up in ipairs(batch) do
        step = step + 1
        if not exclude[up] then
          local m = state_of(up)
          if m and m.e then
            saw = true
            if not at_cap(up) then
              if m.r + 1 < m.c then
                m.r = m.r + 1
                redis.call('HSET', KEYS[2], up, encode(m))
              else
                local granted = grant(up, m, '0')
                if not granted then return in_use() end
                if m.r ~= 0 then
                  m.r = 0
                  redis.call('HSET', KEYS[2], up, encode(m))
                end
                redis.call('HSET', KEYS[1], 'rr', string.format('%d', (idx + j) % n))
                return granted
              end
            end
          end
        end
      end
    end
  end

  if saw then
    return cap_reply()
  end
  return {'none'}
end

-- The n lowest-scored eligible members of `zset` (the pool's, or a subset's), as entries {up,
-- score, step} in its order: the k-th of a batch of acquires without a cap can only take one of
-- the k lowest, since each member before it must have been chosen first to fall behind it. False
-- when there is no eligible member. Nil, for the walk to decide, when a member of the pool's has
-- no state or is not eligible (which no acquire expects there), when a score is not a whole
-- number (allocations times a whole cost always are), when a subset's members passed over (out
-- of service) may hide some beyond those read, or when an id is longer than 1,024 bytes (far
-- beyond a proxy URL; see `byte_order`).
local function lowest_members(zset, n)
  local flat = redis.call('ZRANGE', zset, '0', string.format('%d', n - 1), 'WITHSCORES')
  if #flat == 0 then return false end
  local ups = {}
  for i = 1, #flat, 2 do ups[#ups + 1] = flat[i] end
  local raw = redis.call('HMGET', KEYS[2], unpack(ups))
  local list, passed = {}, false
  for i, up in ipairs(ups) do
    -- Only the cost of the state (see `decode`): eligible, keeps sessions, cost.
    local cost = raw[i] and string.match(raw[i], '^1|%d|(%d+)|[^|]+|%d+$')
    local score = tonumber(flat[2 * i])
    if not score or score ~= math.floor(score) or #up > 1024 or (not cost and zset == KEYS[3]) then
      return nil
    end
    if cost then
      cost = tonumber(cost)
      list[#list + 1] = {up = up, score = score, step = cost >= 1 and cost or 1}
    else
      passed = true
    end
  end
  if passed and #ups == n then return nil end
  return #list > 0 and list
end

-- Sorts entries as the ZSET orders members of equal score: by their bytes, which Lua's `<` does
-- not follow (it is the server's collation). Each id is split into bytes once, and compared past
-- the prefix all of them share (a pool's ids mostly differ at the end).
local function byte_order(list)
  if #list < 2 then return end
  for _, e in ipairs(list) do e.bytes = {string.byte(e.up, 1, -1)} end
  local from = #list[1].bytes + 1
  for i = 2, #list do
    local a, b = list[1].bytes, list[i].bytes
    local j = 1
    while j < from and a[j] == b[j] do j = j + 1 end
    from = j
  end
  table.sort(list, function(x, y)
    local a, b = x.bytes, y.bytes
    local j = from
    while a[j] == b[j] and a[j] ~= nil do j = j + 1 end
    return (a[j] or -1) < (b[j] or -1)
  end)
end

-- Writes the new scores of the entries in `moved` (upstream -> entry, with its `count` of grants)
-- decided on a copy of `zset`. Grants within a subset also count in the pool's ZSET, as
-- `count_allocation` counts them.
local function write_scores(zset, moved)
  local scores = {}
  for up, e in pairs(moved) do
    scores[#scores + 1] = string.format('%.17g', e.score)
    scores[#scores + 1] = up
  end
  if #scores > 0 then
    redis.call('ZADD', zset, 'XX', unpack(scores))
  end
  for up, e in pairs(moved) do
    local score = e.score
    if zset ~= KEYS[3] then
      score = redis.call('ZINCRBY', KEYS[3], string.format('%d', e.count * e.step), up)
    end
    if kept then reindex(up, score, nil) end
  end
end

-- The acquires of a `many` batch under least-used / weighted. Each is decided in order, as a run
-- of its own would decide it: the members ZSET is walked from its lowest score (without a cap
-- only its first member is read) and the chosen member's score is raised at once, so the next
-- acquire sees it. What no later acquire of the batch reads goes out once for the whole batch:
-- the lease ids are checked with one HMGET and claimed with one HSET, their deadlines added with
-- one ZADD, and the live counts raised with one HINCRBY per member (while the batch runs, `live`
-- adds the batch's grants, kept in `pending`, to what Redis holds).
local function many_least_used(leases)
  local ids = {}
  for _, id in ipairs(leases) do
    if id ~= '-' then ids[#ids + 1] = id end
  end
  local claimed = {}
  if #ids > 0 then
    local used = redis.call('HMGET', KEYS[6], unpack(ids))
    for i, id in ipairs(ids) do
      if used[i] then claimed[id] = true end
    end
  end
  local lease_pairs, deadline_pairs = {}, {}
  -- Members whose load index entry moves once the batch is counted: their new scores.
  local moved = {}
  local replies = {}
  for i, id in ipairs(leases) do
    local recorded = id ~= '-'
    if recorded and claimed[id] then
      replies[i] = in_use()
    else
      local saw = false
      local up, m
      if cap == 0 then
        -- No cap: the lowest score wins outright (the walk below covers a member with no state).
        up = redis.call('ZRANGE', KEYS[3], '0', '0')[1]
        m = up and state_of(up)
      end
      if not m then
        local chosen = each_member(KEYS[3], function(u, s)
          saw = true
          if not at_cap(u) then return {u, s} end
        end)
        if chosen then up, m = chosen[1], chosen[2] end
      end
      if m then
        local score = count_allocation(up, m)
        if kept and score then moved[up] = score end
        if recorded then
          claimed[id] = true
          pending[up] = (pending[up] or 0) + 1
          lease_pairs[#lease_pairs + 1] = id
          lease_pairs[#lease_pairs + 1] = up
          deadline_pairs[#deadline_pairs + 1] = deadline_s
          deadline_pairs[#deadline_pairs + 1] = id
        end
        replies[i] = 'granted 0 ' .. up
      elseif saw then
        -- Every member is at its cap: the earliest deadline, this batch's grants included.
        local reply = cap_reply()
        if #deadline_pairs > 0 and (reply[2] == '-1' or tonumber(reply[2]) > deadline) then
          reply[2] = deadline_s
        end
        replies[i] = reply
      else
        replies[i] = {'none'}
      end
    end
  end
  if #lease_pairs > 0 then
    redis.call('HSET', KEYS[6], unpack(lease_pairs))
    redis.call('ZADD', KEYS[5], unpack(deadline_pairs))
    for up, count in pairs(pending) do
      redis.call('HINCRBY', KEYS[7], up, string.format('%d', count))
    end
  end
  for up, score in pairs(moved) do
    reindex(up, score, nil)
  end
  return replies
end

-- A reply of the many mode as one string (an error stays an error).
local function line(reply)
  if type(reply) == 'string' or reply.err then return reply end
  if reply[1] == 'granted' then
    return 'granted ' .. reply[3] .. ' ' .. reply[2]
  end
  return table.concat(reply, ' ')
end

-- The tally mode (see the header): how many of n acquires each member gets, as `many` would
-- decide them one by one, without a ZRANGE and a ZINCRBY per acquire (with the Lua around them,
-- most of Redis's time in a batch, and half its CPU per request in all). Member i's j-th grant comes when
-- its score is s_i + j x step_i, and grants go by that score, then by the ZSET's order; so the n
-- grants are the n smallest such keys, all among the n lowest members. T, the smallest score
-- with at least n keys at or below it, is found by bisection; every key below T is granted, the
-- rest go to the members with a key at T in the ZSET's order, and each score is written once.
-- Where `lowest_members` cannot say (see there), the acquires are decided one by one as in
-- `many`.
local function tally(n)
  local zset = sub or KEYS[3]
  local order = lowest_members(zset, n)
  if order == false then return {} end
  local flat = {}
  if not order then
    local replies, counts, firsts = {}, {}, {}
    if sub then
      -- As single `within` acquires of unlisted leases.
      mode, lease = 'any', '-'
      for i = 1, n do replies[i] = line(pick_within()) end
    else
      for i = 1, n do replies[i] = '-' end
      replies = many_least_used(replies)
    end
    for _, reply in ipairs(replies) do
      if type(reply) == 'string' and string.sub(reply, 1, 10) == 'granted 0 ' then
        local up = string.sub(reply, 11)
        if not counts[up] then firsts[#firsts + 1] = up end
        counts[up] = (counts[up] or 0) + 1
      end
    end
    for _, up in ipairs(firsts) do
      flat[#flat + 1] = up
      flat[#flat + 1] = string.format('%d', counts[up])
    end
    return flat
  end
  local function keys_upto(t)
    local total = 0
    for _, e in ipairs(order) do
      if e.score <= t then total = total + math.floor((t - e.score) / e.step) + 1 end
    end
    return total
  end
  local lo = order[1].score
  local hi = lo + (n - 1) * order[1].step
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if keys_upto(mid) >= n then hi = mid else lo = mid + 1 end
  end
  local t, given, at = lo, 0, {}
  for _, e in ipairs(order) do
    e.count = 0
    if e.score < t then
      e.count = math.floor((t - 1 - e.score) / e.step) + 1
      given = given + e.count
    end
    if e.score <= t and (t - e.score) % e.step == 0 then at[#at + 1] = e end
  end
  -- Those of one score are in the ZSET's order already (the common case in a large pool).
  for _, e in ipairs(at) do
    if e.score ~= at[1].score then
      byte_order(at)
      break
    end
  end
  for i = 1, n - given do at[i].count = at[i].count + 1 end
  local moved = {}
  for _, e in ipairs(order) do
    if e.count > 0 then
      e.score = e.score + e.count * e.step
      moved[e.up] = e
      flat[#flat + 1] = e.up
      flat[#flat + 1] = string.format('%d', e.count)
    end
  end
  write_scores(zset, moved)
  return flat
end

if mode == 'tally' then
  return tally(tally_n)
end
if mode == 'many' then
  local replies
  if strategy == 'least-used' or strategy == 'weighted' then
    local leases = {}
    for i = 8, #ARGV do leases[#leases + 1] = ARGV[i] end
    replies = many_least_used(leases)
  else
    replies = {}
    for i = 8, #ARGV do
      lease = ARGV[i]
      replies[#replies + 1] = pick()
    end
  end
  for i, reply in ipairs(replies) do
    replies[i] = line(reply)
  end
  return replies
end
if batch_within then
  local replies = {}
  -- Least-connections reads the subset once for the whole batch.
  local cands = strategy == 'least-connections' and lc_candidates()
  for i = 8, #ARGV do
    lease = ARGV[i]
    replies[#replies + 1] = line(cands and lc_pick(cands) or pick())
  end
  return replies
end
for i = excl_first, excl_last do
  exclude[ARGV[i]] = true
end
return pick()
