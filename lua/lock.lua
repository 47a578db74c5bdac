-- Take a uniqueness lock for one jid, in v9's format: the hash
-- "<digest>:LOCKED" (jid -> metadata JSON) indexed in "uniquejobs:digests".
-- KEYS[1] the locked hash, KEYS[2] the digests zset, KEYS[3] (optional) the
-- waiting zset of jids queued for this lock in arrival order.
-- ARGV[1] jid, ARGV[2] ttl in ms (0 = none), ARGV[3] lock type,
-- ARGV[4] limit, ARGV[5] metadata JSON, ARGV[6] now (float seconds),
-- ARGV[7] arrival time of this waiter, ARGV[8] waiters that arrived before
-- this score gave up long ago (crashed) and are dropped.
-- Returns 2 when jid already held it (no refresh, as v9), 1 when taken,
-- 0 when the limit is reached, -1 when earlier waiters go first.
local locked, digests, jid = KEYS[1], KEYS[2], ARGV[1]
if redis.call('HEXISTS', locked, jid) == 1 then
  if KEYS[3] then redis.call('ZREM', KEYS[3], jid) end
  return 2
end
local waiting = KEYS[3]
if waiting then
  redis.call('ZADD', waiting, 'NX', ARGV[7], jid)
  redis.call('ZREMRANGEBYSCORE', waiting, '-inf', '(' .. ARGV[8])
  local first = redis.call('ZRANGE', waiting, 0, 0)[1]
  if first and first ~= jid then
    return -1
  end
end
local limit = tonumber(ARGV[4]) or 1
-- v9 reads a null limit as 0 and then refuses everyone: take 1 instead.
if limit < 1 then limit = 1 end
if redis.call('HLEN', locked) >= limit then
  return 0
end
redis.call('HSET', locked, jid, ARGV[5])
local pttl = tonumber(ARGV[2]) or 0
local score = tonumber(ARGV[6])
-- v9 adds milliseconds to seconds here, pushing until_expired entries years
-- ahead of the reaper; the expiry time in seconds is what it meant.
if ARGV[3] == 'until_expired' and pttl > 0 then
  score = score + pttl / 1000
end
local digest = string.gsub(locked, ':LOCKED$', '')
redis.call('ZADD', digests, score, digest)
if pttl > 0 then
  redis.call('PEXPIRE', locked, pttl)
end
if waiting then
  redis.call('ZREM', waiting, jid)
end
return 1
