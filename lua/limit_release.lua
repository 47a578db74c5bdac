-- Gives back a concurrent limiter's slot, or extends its lease; only the
-- holder can. KEYS[1] limiter:NAME:held, KEYS[2] limiter:NAME:meta. ARGV[1]
-- holder id, ARGV[2] lease (ms) to extend by from now, or "" to release.
-- Returns 1 when id held a live slot (now released or extended), else 0.
local held, id = KEYS[1], ARGV[1]
if ARGV[2] == '' then return redis.call('ZREM', held, id) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = tonumber(redis.call('ZSCORE', held, id) or '0')
if until_ms <= now then
  redis.call('ZREM', held, id)
  return 0
end
local ms = tonumber(ARGV[2])
redis.call('ZADD', held, now + ms, id)
-- Both keys live as long as the longest lease (limit_acquire.lua).
for _, k in ipairs(KEYS) do
  if redis.call('PTTL', k) < ms then redis.call('PEXPIRE', k, ms) end
end
return 1
