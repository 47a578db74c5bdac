-- Gives back a concurrent limiter's slot, or extends its lease; only the
-- holder can. KEYS[1] limiter:NAME:held, KEYS[2] limiter:NAME:meta,
-- KEYS[3] limiter:NAME:free (the list its waiters block on). ARGV[1]
-- holder id, ARGV[2] "release" or "extend", ARGV[3] the lease (ms): what
-- to extend by from now, and how long a release's wake-up is worth
-- keeping; ARGV[4] the limiter's size.
-- Returns 1 when id held a live slot (now released or extended), else 0.
local held, id, ms = KEYS[1], ARGV[1], tonumber(ARGV[3])
if ARGV[2] == 'release' then
  local n = redis.call('ZREM', held, id)
  if n == 1 then
    -- Wakes one waiter (BLPOP serves the longest blocked first) so that it
    -- takes the slot now rather than at its next recheck. Pushed even when
    -- no one waits: a waiter between its refusal and its BLPOP finds it.
    -- More than size of them wake no one more, hence the trim; a stale
    -- one costs a waiter one refused attempt, and none outlives a lease.
    redis.call('RPUSH', KEYS[3], '1')
    redis.call('LTRIM', KEYS[3], -tonumber(ARGV[4]), -1)
    redis.call('PEXPIRE', KEYS[3], ms)
  end
  return n
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = tonumber(redis.call('ZSCORE', held, id) or '0')
if until_ms <= now then
  redis.call('ZREM', held, id)
  return 0
end
redis.call('ZADD', held, now + ms, id)
-- Both keys live as long as the longest lease (limit_acquire.lua).
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < ms then redis.call('PEXPIRE', KEYS[i], ms) end
end
return 1
