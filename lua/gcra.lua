#!lua
-- gcra.lua: one decision of the generic cell rate algorithm (redis-cell / redis_rate
-- semantics), on the Redis server's clock.
--
-- KEYS[1]  the key's theoretical arrival time (TAT), microseconds on the server clock
-- ARGV[1]  emission interval in microseconds (period / rate)
-- ARGV[2]  burst: how many requests may arrive at once (>= 1)
-- ARGV[3]  cost of this request (>= 1), or 0 to peek without consuming
--
-- Returns {allowed, remaining, retry_after_us, reset_after_us}
--   allowed          1 if the request (of cost 1 when peeking) fits (and, with cost > 0,
--                    was counted), else 0
--   remaining        requests of cost 1 that would still fit right now
--   retry_after_us   when refused: how long until this cost would fit; else -1
--   reset_after_us   how long until the key is back to a full burst
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
  tat = now
end
local burst_offset = interval * burst
-- A peek decides a request of cost 1, without counting it.
local probe = cost
if probe == 0 then
  probe = 1
end
local new_tat = tat + interval * probe
local diff = now - (new_tat - burst_offset)
if diff < 0 then
  -- Refused: report what one more unit would need as well.
  return {0, 0, new_tat - burst_offset - now, tat - now}
end
if cost == 0 then
  -- Remaining counts the probed request too: nothing was taken.
  return {1, math.floor(diff / interval) + 1, -1, tat - now}
end
-- %d: the default number format would round a microsecond timestamp.
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1)
return {1, math.floor(diff / interval), -1, new_tat - now}
