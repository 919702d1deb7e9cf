-- unbind.lua: deletes a session binding if it still points at the given upstream.
--
-- KEYS[1]  sess           STRING  the session's upstream
-- KEYS[2]  session_count  HASH    expiry second -> bindings; n (see acquire.lua)
--
-- ARGV[1]  upstream
--
-- Returns  1 when the binding was deleted, else 0

-- The same as in acquire.lua.
local BUCKET_MS = 1000

if #KEYS < 2 or not ARGV[1] then
  return redis.error_reply('ERR unbind: bad arguments')
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- Out of the count, if its second is still counted (see acquire.lua's uncount).
local old = redis.call('PEXPIRETIME', KEYS[1])
redis.call('DEL', KEYS[1])
if old > 0 then
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
return 1
