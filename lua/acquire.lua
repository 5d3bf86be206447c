#!lua
-- acquire.lua: take or re-enter a reentrant lock.
--
-- KEYS[1]  lock hash  {owner -> hold count}, with a PEXPIRE lease
-- KEYS[2]  fencing counter of the lock (never expires; INCR on every fresh grant)
-- ARGV[1]  owner id (client id + scope counter)
-- ARGV[2]  lease in milliseconds
--
-- Returns one of
--   {1, hold_count, fencing_token}   granted (hold_count == 1: fresh grant, > 1: re-entered)
--   {0, pttl_ms}                     held by another owner; pttl_ms is its remaining lease
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, 1, redis.call('INCR', KEYS[2])}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  -- Re-entering never shortens the lease the outer hold already has.
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, count, tonumber(redis.call('GET', KEYS[2]) or 0)}
end
return {0, redis.call('PTTL', KEYS[1])}
