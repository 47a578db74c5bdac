-- One attempt to take a rate limiter (include/capstan/limiter.h).
-- KEYS[1] limiter:NAME:meta (the type and parameters the name was first
-- used with), KEYS[2] the state key: limiter:NAME:held (concurrent: zset of
-- holder ids scored by lease expiry, ms), limiter:NAME:bucket (hash tokens,
-- refill_at), limiter:NAME:sliding (zset of acquisitions by time),
-- limiter:NAME:leaky or :points (hash level, at) or limiter:NAME:w: (window: the prefix of one counter per
-- window start; the window key is made here from the server clock, so
-- this script is not for Redis Cluster).
-- ARGV[1] type, ARGV[2] meta text, ARGV[3] size or count, ARGV[4] lease or
-- interval (ms), ARGV[5] holder id (concurrent) or acquisition id (sliding),
-- ARGV[6] cost (points).
-- Returns {1, 0} taken, {0, ms} refused and the ms until a slot may be
-- free, {-1, meta} the name is used with other parameters.
-- Times come from the Redis server so that every process agrees.
-- Every key expires once the limiter is unused: the state when nothing in
-- it matters any more (a lapsed lease, a past window, a drained level,
-- all within an interval or a lease), and the meta after it, as each
-- acquisition keeps the meta for two intervals (or leases).
local meta = redis.call('GET', KEYS[1])
if meta and meta ~= ARGV[2] then return {-1, meta} end
if not meta then redis.call('SET', KEYS[1], ARGV[2]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kind, size, ms = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
-- Key k lives at least ttl ms more; never shortened, as a holder with a
-- longer lease (in another process) may need more.
local function keep(k, ttl)
  if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
end
local function taken()
  keep(KEYS[1], 2 * ms)
  return {1, 0}
end
if kind == 'concurrent' then
  local held, id = KEYS[2], ARGV[5]
  redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
  if redis.call('ZSCORE', held, id) or redis.call('ZCARD', held) < size then
    redis.call('ZADD', held, now + ms, id)
    keep(held, ms)
    return taken()
  end
  local first = redis.call('ZRANGE', held, 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) - now}
end
local start = now - now % ms
if kind == 'window' then
  local key = KEYS[2] .. start
  local n = tonumber(redis.call('GET', key) or '0')
  if n >= size then return {0, start + ms - now} end
  redis.call('INCR', key)
  redis.call('PEXPIRE', key, ms)
  return taken()
end
if kind == 'bucket' then
  local b = KEYS[2]
  local tokens = tonumber(redis.call('HGET', b, 'tokens') or size)
  local refill = tonumber(redis.call('HGET', b, 'refill_at') or '0')
  if now >= refill then
    tokens = size
    refill = start + ms
  end
  if tokens < 1 then return {0, refill - now} end
  redis.call('HSET', b, 'tokens', tokens - 1, 'refill_at', refill)
  redis.call('PEXPIRE', b, refill - now)
  return taken()
end
if kind == 'sliding' then
  local s, id = KEYS[2], ARGV[5]
  redis.call('ZREMRANGEBYSCORE', s, '-inf', now - ms)
  if redis.call('ZCARD', s) < size then
    redis.call('ZADD', s, now, id)
    redis.call('PEXPIRE', s, ms)
    return taken()
  end
  local first = redis.call('ZRANGE', s, 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) + ms - now}
end
if kind == 'leaky' or kind == 'points' then
  -- level drains at size per interval; cost points fit while
  -- level + cost <= size (leaky: cost 1).
  local b, cost = KEYS[2], tonumber(ARGV[6] or '1')
  local level = tonumber(redis.call('HGET', b, 'level') or '0')
  local at = tonumber(redis.call('HGET', b, 'at') or now)
  level = math.max(0, level - (now - at) * size / ms)
  if level + cost > size then
    return {0, math.ceil((level + cost - size) * ms / size)}
  end
  level = level + cost
  redis.call('HSET', b, 'level', tostring(level), 'at', now)
  redis.call('PEXPIRE', b, math.ceil(level * ms / size) + 1)
  return taken()
end
return redis.error_reply('unknown limiter type ' .. kind)
