-- record.lua: counts one exchange's outcome without touching any lease (the earlier exchanges of
-- an inspected tunnel, and client feedback).
--
-- KEYS[1]  stats  HASH  "<upstream>\n<outcome>" -> count, "<upstream>\nlatency_us" -> sum,
--                       "<upstream>\nlatency_n" -> count
--
-- ARGV[1]  upstream    ARGV[2]  outcome    ARGV[3]  latency (microseconds)
--
-- Returns  1

local latency = tonumber(ARGV[3])
if #KEYS < 1 or not ARGV[1] or ARGV[1] == '' or not ARGV[2] or ARGV[2] == '' or not latency
    or latency < 0 then
  return redis.error_reply('ERR record: bad arguments')
end
redis.call('HINCRBY', KEYS[1], ARGV[1] .. '\n' .. ARGV[2], 1)
redis.call('HINCRBY', KEYS[1], ARGV[1] .. '\nlatency_us', math.floor(latency))
redis.call('HINCRBY', KEYS[1], ARGV[1] .. '\nlatency_n', 1)
return 1
