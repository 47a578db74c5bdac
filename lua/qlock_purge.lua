-- Drop dead requests from one lock queue: those older than dead_ttl whose
-- waiter has not tried within its own queue_ttl (a waiter still retrying
-- keeps its place, however long it has waited). Gem waiters, which leave no
-- deadline, go on age alone, as the gem's clear_dead_requests does.
-- KEYS[1] rql:lock_queue:NAME   KEYS[2] side hash acq_id -> deadline ms
-- ARGV[1] dead_ttl ms.   Returns the number of requests dropped.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = (now_ms - tonumber(ARGV[1])) / 1000
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%.6f', cutoff))
local n = 0
for _, who in ipairs(old) do
  local deadline = tonumber(redis.call('HGET', KEYS[2], who))
  if not deadline or deadline < now_ms then
    redis.call('ZREM', KEYS[1], who)
    redis.call('HDEL', KEYS[2], who)
    n = n + 1
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2])
end
return n
