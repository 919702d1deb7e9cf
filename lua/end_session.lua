-- end_session.lua: deletes a session binding, whatever upstream it points at (an admin action).
--
-- KEYS[1]  sess           STRING  the session's upstream
-- KEYS[2]  session_count  HASH    expiry second -> bindings; n (see acquire.lua)
--
-- Returns  1 when a live binding was deleted, else 0

-- The same as in acquire.lua.
local BUCKET_MS = 1000

if #KEYS < 2 then
  return redis.error_reply('ERR end_session: bad arguments')
end
-- Out of the count, if its second is still counted (see acquire.lua's uncount).
local old = redis.call('PEXPIRETIME', KEYS[1])
local existed = redis.call('DEL', KEYS[1])
if existed == 1 and old > 0 then
  local f = string.format('%d', math.ceil(old / BUCKET_MS))
  local c = redis.call('HGET', KEYS[2], f)
  if c then
    if tonumber(c) <= 1 then
      redis.call('HDEL', KEYS[2], f)
    else
      redis.call('HINCRBY', KEYS[2], f, '-1')
    end
    redis.call('HINCRBY', KEYS[2], 'n', '-1')
  end
end
return existed
