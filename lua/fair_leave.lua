#!lua flags=allow-oom
-- fair_leave.lua: a waiter leaves a fair lock's line (fair.lua), and if it headed the
-- line while the lock is free, the next head is woken. It only removes and publishes,
-- so a full server (one that refuses fair.lua) still runs it and the line moves on.
--
-- KEYS[1]  the lock
-- KEYS[2]  the queue: a list of waiting owners, the oldest first
-- KEYS[3]  the queue's deadlines: a sorted set, owner -> server time (ms) its place lapses
-- ARGV[1]  the owner leaving (client id and scope)
-- ARGV[2]  the release channel: the head of the queue is woken on '<channel>:<owner>'
--
-- Returns {1, 0}: done, whether or not the owner queued.
local lock, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local owner, channel = ARGV[1], ARGV[2]
local was_head = redis.call('LINDEX', queue, 0) == owner
redis.call('LREM', queue, 0, owner)
redis.call('ZREM', deadlines, owner)
if was_head and redis.call('EXISTS', lock) == 0 then
  local head = redis.call('LINDEX', queue, 0)
  if head then
    -- pcall, as in release.lua: a publish the user's ACL refuses undoes nothing.
    redis.pcall('PUBLISH', channel .. ':' .. head, owner)
  end
end
return {1, 0}
