#!lua
-- limit_rule.lua: the seed's AccessSpeedLimit rule: at most `limit` calls per window of
-- `seconds`; past `lock_count` calls in one window the key is locked out for `lock_time`.
--
-- KEYS[1]  the call counter of the current window (expires with the window)
-- KEYS[2]  the lockout marker (expires when the lockout ends)
-- ARGV[1]  window length in seconds
-- ARGV[2]  limit: calls allowed per window
-- ARGV[3]  lock count: calls per window past which the key is locked out (0: never)
-- ARGV[4]  lock time in seconds
--
-- Returns {allowed, count, retry_after_ms, locked_out}
--   allowed         1 if the call passes
--   count           calls counted in the current window (0 while locked out)
--   retry_after_ms  when refused: until the window or the lockout ends; else 0
--   locked_out      1 while the key is locked out (including the call that started it)
local lock_ttl = redis.call('PTTL', KEYS[2])
if lock_ttl > 0 then
  return {0, 0, lock_ttl, 1}
end
local count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
local lock_count = tonumber(ARGV[3])
if lock_count > 0 and count > lock_count then
  redis.call('SET', KEYS[2], '1', 'EX', ARGV[4])
  redis.call('DEL', KEYS[1])
  return {0, count, tonumber(ARGV[4]) * 1000, 1}
end
if count <= tonumber(ARGV[2]) then
  return {1, count, 0, 0}
end
return {0, count, math.max(redis.call('PTTL', KEYS[1]), 0), 0}
