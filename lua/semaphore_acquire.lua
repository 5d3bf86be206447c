#!lua
-- semaphore_acquire.lua: take n permits of an expiring semaphore, or say when to retry.
--
-- KEYS[1]   sorted set {permit id -> expiry}, expiry in ms on the Redis server's clock
-- ARGV[1]   limit: permits that may be in use at once (every user of the name passes the same)
-- ARGV[2]   lease of the new permits, in milliseconds
-- ARGV[3..] ids of the n >= 1 new permits (unique, made by the client)
--
-- Expired permits are removed first. The set's own PEXPIRE follows its latest expiry, so
-- an abandoned semaphore disappears by itself.
--
-- Returns one of
--   {1, free}            granted; free permits left now
--   {0, retry_ms, free}  not enough free permits; in retry_ms enough of them expire
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit = tonumber(ARGV[1])
local used = redis.call('ZCARD', KEYS[1])
local n = #ARGV - 2
if used + n <= limit then
  local expiry = now + tonumber(ARGV[2])
  for i = 3, #ARGV do
    redis.call('ZADD', KEYS[1], expiry, ARGV[i])
  end
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(last[2]) - now, 1))
  return {1, limit - used - n}
end
-- Enough permits are free once the (used + n - limit)-th earliest one has expired.
local k = used + n - limit - 1
local nth = redis.call('ZRANGE', KEYS[1], k, k, 'WITHSCORES')
local retry = 1
if nth[2] then
  retry = math.max(tonumber(nth[2]) - now, 1)
end
return {0, retry, math.max(limit - used, 0)}
