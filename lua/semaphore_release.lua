#!lua flags=allow-oom
-- semaphore_release.lua: give back permits of an expiring semaphore by id.
--
-- KEYS[1]   sorted set {permit id -> expiry}, expiry in ms on the Redis server's clock
-- KEYS[2]   release channel of the semaphore (waiters subscribe to it)
-- ARGV[1]   payload published on KEYS[2] when a permit was given back (the releasing client's id)
-- ARGV[2..] ids of the permits to give back
--
-- Expired permits are removed first, so an id whose lease has passed counts as not held.
--
-- Returns
--   released  how many of the ids were still held and are free now (0..#ids); the rest
--             had expired (or were never granted). A message is published when released > 0.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local released = 0
for i = 2, #ARGV do
  released = released + redis.call('ZREM', KEYS[1], ARGV[i])
end
if released > 0 then
  -- pcall, as in release.lua: a publish the user's ACL refuses undoes nothing.
  redis.pcall('PUBLISH', KEYS[2], ARGV[1])
end
return released
