#!lua flags=allow-oom
-- semaphore_extend.lua: set the lease of held permits to a new length from now.
--
-- KEYS[1]   sorted set {permit id -> expiry}, expiry in ms on the Redis server's clock
-- ARGV[1]   new lease in milliseconds, counted from now
-- ARGV[2..] ids of the permits to extend
--
-- Expired permits are removed first and never come back: an expired id is not extended.
-- The set's own PEXPIRE is moved to its latest expiry.
--
-- Returns
--   extended  how many of the ids were still held and now expire ARGV[1] ms from now
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local expiry = now + tonumber(ARGV[1])
local extended = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
    extended = extended + 1
  end
end
if extended > 0 then
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(last[2]) - now, 1))
end
return extended
